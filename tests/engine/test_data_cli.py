"""`python -m engine prepare | regenerate | extract` end to end on a tiny target (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]


def _engine(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "chats.jsonl"
    rows = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"hello {i} how are you?"},
                                              {"from": "gpt", "value": "fine, thank you " * (1 + i % 3)}]}
            for i in range(8)]
    rows.append({"weird": "row"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prepare_prints_summary_preview_and_writes_rows(tiny_targets, chats, tmp_path):
    out = tmp_path / "rows.jsonl"
    proc = _engine("prepare", "--target", str(tiny_targets["llama"]), "--dataset", str(chats), "--split", "all",
                   "--out", str(out), "--max-length", "64")
    assert "shape conversations" in proc.stdout and "'unknown shape': 1" in proc.stdout
    assert "⟦fine, thank you" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and set(rows[0]) == {"id", "input_ids", "loss_mask"}
    proc = _engine("prepare", "--target", str(tiny_targets["llama"]), "--dataset", str(chats), "--split", "all",
                   "--json")
    assert json.loads(proc.stdout)["skipped"] == {"unknown shape": 1}


def test_extract_end_to_end_and_resume(tiny_targets, chats, tmp_path):
    out = tmp_path / "hs"
    args = ["extract", "--target", str(tiny_targets["llama"]), "--dataset", str(chats), "--split", "all",
            "--layers", "1,4", "--out", str(out), "--max-length", "64", "--max-samples", "5"]
    proc = _engine(*args)
    manifest = json.loads(proc.stdout)
    assert manifest["samples"] == 5 and manifest["layer_ids"] == [1, 4] and manifest["dtype"] == "bf16"
    data = load_file(str(out / "hs_4.safetensors"))
    assert data["hidden_states"].shape[1:] == (2, 64) and data["token_ids"].shape[0] == data["hidden_states"].shape[0]
    proc = _engine(*args[:-1], "8")  # more samples later: the first five are kept
    assert json.loads(proc.stdout)["samples"] == 8 and "resuming: 5 samples" in proc.stderr
    bad = _engine(*[a if a != "1,4" else "2,4" for a in args], check=False)
    assert bad.returncode == 2 and "other settings" in bad.stderr and "Fix:" in bad.stderr


def test_extract_from_prepared_rows_with_algo_default(tiny_targets, chats, tmp_path):
    rows = tmp_path / "rows.jsonl"
    _engine("prepare", "--target", str(tiny_targets["qwen3"]), "--dataset", str(chats), "--split", "all",
            "--out", str(rows), "--preview", "0")
    proc = _engine("extract", "--target", str(tiny_targets["qwen3"]), "--dataset", str(rows), "--split", "all",
                   "--algo", "dflash", "--dtype", "fp16", "--out", str(tmp_path / "hs"))
    manifest = json.loads(proc.stdout)
    assert manifest["layer_ids"] == [2, 4] and manifest["algo"] == "dflash" and manifest["samples"] == 8
    assert load_file(str(tmp_path / "hs" / "hs_0.safetensors"))["hidden_states"].dtype.is_floating_point


def test_regenerate_end_to_end(tiny_targets, chats, tmp_path):
    out = tmp_path / "regen.jsonl"
    proc = _engine("regenerate", "--target", str(tiny_targets["llama"]), "--dataset", str(chats), "--split", "all",
                   "--max-samples", "3", "--max-new-tokens", "3", "--out", str(out))
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["out"] == str(out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["messages"][-1]["role"] == "assistant" for r in rows)


def test_vllm_backend_without_vllm_is_a_clear_cli_error(tiny_targets, chats, tmp_path, monkeypatch):
    """No vLLM here and no vLLM environment: refused up front; vLLM's CPU build with a head size it has no kernel for
    (the tiny targets' 16): refused up front too, before any vLLM starts."""
    argv = ("extract", "--target", str(tiny_targets["llama"]), "--dataset", str(chats), "--backend", "vllm",
            "--out", str(tmp_path / "hs"))
    monkeypatch.setenv("WORKBENCH_VLLM_VENV", str(tmp_path / "no-vllm-env"))
    proc = _engine(*argv, check=False)
    if proc.returncode == 0:
        pytest.skip("vLLM with a GPU is available in this environment")
    assert proc.returncode == 2 and "cannot run" in proc.stderr and "--backend transformers" in proc.stderr
    monkeypatch.delenv("WORKBENCH_VLLM_VENV")
    from engine.serve.venv import read_stamp

    if read_stamp() is not None and read_stamp().flavor == "cpu":
        proc = _engine(*argv, check=False)
        assert proc.returncode == 2 and "head size is 16" in proc.stderr and "--backend transformers" in proc.stderr
        assert not (tmp_path / "hs").exists()


def test_extract_as_a_background_job_reports_progress(tiny_targets, chats, tmp_path):
    from engine import jobs

    out = tmp_path / "hs"
    job = jobs.launch(["extract", "--target", str(tiny_targets["llama"]), "--dataset", str(chats), "--split", "all",
                       "--layers", "2,4", "--max-length", "48", "--out", str(out)], root=tmp_path / "runs")
    job = jobs.wait(job, timeout=300)
    assert job.status.state == "done", job.log_tail()
    assert job.status.progress == 1.0 and job.status.result["samples"] == 8
    assert "extracted 8 samples" in job.status.message
