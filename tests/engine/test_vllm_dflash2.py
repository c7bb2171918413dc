"""DFlash2 and real vLLM (the CPU build in .venv-vllm). The build refuses to serve DFlash2, and the first test shows
why in vLLM's own words (`validate` says so beforehand). As a labelled STAND-IN for serving, the second test runs
vLLM's own DFlash2 pieces (`models/qwen3_dflash2.py`: the grouped convolution module, `_score_edges`, the draft
head's top-k) in vLLM's interpreter on our checkpoint and compares them with our draft. Serving a trained DFlash2
draft in real vLLM needs a GPU: `benchmarks/gpu_check.py` does it there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.algos import ALGOS
from engine.algos.dflash2.args import DFlash2Args
from engine.algos.dflash2.config import VLLM_V1_REFUSAL
from engine.algos.dflash2.io import build_dflash2, save_dflash2

ROOT = Path(__file__).resolve().parents[2]
PIECES = ROOT / "tests" / "testkit" / "vllm_dflash2.py"  # run by vLLM's interpreter, not imported
BLOCK = 4


def vllm_python() -> Path:
    from engine.serve.venv import vllm_venv_dir

    python = vllm_venv_dir() / "bin" / "python"
    if not python.exists():
        pytest.skip("no vLLM environment (.venv-vllm)")
    return python


@pytest.mark.vllm
def test_vllms_cpu_build_refuses_dflash2_and_validate_says_so_first(builtin_target, tmp_path):
    from engine.format.validate import validate_draft
    from engine.targets.verifier import load_verifier_parts

    algo = ALGOS.get("dflash2")
    args = algo.args_class(num_layers=1, block_size=BLOCK, selector_rank=8)
    draft = algo.build(load_verifier_parts(target=builtin_target), args, token_counts=None, seed=0,
                       aux_layer_ids=algo.default_layer_ids(builtin_target.num_layers))
    path = save_dflash2(draft.eval(), tmp_path / "draft", dtype=torch.float32)
    report = validate_draft(path)
    assert report.ok and any(VLLM_V1_REFUSAL in w.message and "GPUs only" in w.message for w in report.warnings)
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--draft", str(path), "--no-validate",
                          "--foreground", "--timeout", "600"], capture_output=True, text=True, timeout=900, cwd=ROOT,
                         env={**os.environ, "WORKBENCH_RUNS": str(tmp_path / "runs")})
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert VLLM_V1_REFUSAL in out.stderr, out.stderr[-3000:]  # vLLM's words, at VllmConfig, before any weight loads


@pytest.mark.vllm
def test_stand_in_vllms_dflash2_pieces_compute_our_convolutions_scores_and_drafts(tiny_targets, tmp_path):
    """STAND-IN for serving (the CPU build refuses DFlash2): on our saved checkpoint, vLLM's DFlashGroupedConv
    (its weight loaders, its `_grouped_conv` CPU path), its draft head's top-k, its `_score_edges` and the greedy
    path of its selector walk give our convolutions, candidates, selector scores and greedy drafts."""
    from safetensors.torch import load_file, save_file

    from engine.targets.loading import load_target

    tiny = load_target(str(tiny_targets["llama"]))
    draft = build_dflash2(tiny, DFlash2Args(num_layers=2, block_size=BLOCK, selector_rank=16, conv_kernel_size=3),
                          aux_layer_ids=[1, 2, 3], seed=5).eval()
    with torch.no_grad():  # random convolutions and a selector that moves choices (a fresh draft is near identity)
        for name, p in draft.named_parameters():
            if "conv" in name:
                p.normal_(0.0, 0.2)
            elif name.startswith("candidate_selector"):
                p.normal_(0.0, 0.5)
    folder = save_dflash2(draft, tmp_path / "draft", dtype=torch.float32)
    torch.manual_seed(0)
    t, n = 37, 6
    aux, ids = torch.randn(1, t, draft.fc.in_features), torch.randint(3, tiny.vocab_size, (1, t))
    anchors = torch.arange(5, 5 + 4 * n, 4)
    with torch.no_grad():
        x = draft.anchored_hidden(aux, ids, torch.arange(t)[None], torch.zeros_like(ids), anchors)  # [n, B, H]
        hidden = draft.norm(x)[:, 1:].contiguous()                                 # the drafting slots
        tokens, scores, candidates = draft.walk(hidden, ids[0, anchors], lambda s: s.argmax(-1))
    inputs = {"conv_in": torch.randn(3 * BLOCK, tiny.hidden_size), "conv_mid": torch.randn(3 * BLOCK, tiny.hidden_size),
              "hidden": hidden, "anchors": ids[0, anchors].contiguous(), "head": tiny.lm_head().weight.detach().float()}
    save_file(inputs, str(tmp_path / "in.safetensors"))
    run = subprocess.run([str(vllm_python()), "-P", str(PIECES),  # -P: testkit/vllm.py must not shadow vllm
                          str(folder), str(tmp_path / "in.safetensors"),
                          str(tmp_path / "out.safetensors"), str(BLOCK), str(draft.top_k)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = load_file(str(tmp_path / "out.safetensors"))

    with torch.no_grad():
        for i, layer in enumerate(draft.layers):
            for side in ("attention_conv", "mlp_conv"):
                prepared, delta = getattr(layer, side).prepare(inputs["conv_in"])
                assert (theirs[f"{i}.{side}.prepared"] - prepared).abs().max() <= 1e-5, (i, side)
                finished = getattr(layer, side).finish(inputs["conv_mid"], delta)
                assert (theirs[f"{i}.{side}.finished"] - finished).abs().max() <= 1e-5, (i, side)
        unary = draft.project(hidden)
    assert torch.equal(theirs["candidates"], candidates)
    assert (theirs["unary"] - unary.gather(-1, candidates)).abs().max() <= 1e-4
    for step, ours in enumerate(scores):  # the rows the walk read: the anchor's, then the previous choice's
        prev = torch.zeros(n, dtype=torch.long) if step == 0 else \
            (candidates[:, step - 1] == tokens[:, step - 1, None]).long().argmax(-1)
        row = theirs["edges"][torch.arange(n), step, prev]
        assert (row - ours).abs().max() <= 1e-4, step
    assert torch.equal(theirs["tokens"], tokens)
    assert (tokens != unary.argmax(-1)).any()  # the selector moved some drafts: the comparison covers it
