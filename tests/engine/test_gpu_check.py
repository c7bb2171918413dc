"""benchmarks/gpu_check.py runs anywhere: without a GPU every check is a clean SKIP and the exit code is 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the checks run for real")
def test_gpu_check_skips_cleanly_without_a_gpu():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("gpu_check:")]
    names = [ln.split()[1] for ln in lines]
    assert names == ["tiny-target", "cuda-extract-transformers", "cuda-train-bf16", "vllm-extract", "nccl-ddp-2gpu",
                     "nccl-fsdp-2gpu", "vllm-serve-dflash2", "vllm-serve-gemma4-dspark"]
    assert all(ln.startswith("SKIP") for ln in lines), proc.stdout
    assert "Traceback" not in proc.stderr and "0 fail" in proc.stdout
