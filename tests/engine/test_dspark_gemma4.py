"""DSpark beside Gemma 4 in the layout of vLLM's `Gemma4DSparkModel`: chosen for a Gemma 4 target, trained without
`--target`, lossless in-process with drafts accepted, checked by `validate`, and planned by `serve` in vLLM's own
form. The CPU build cannot run DSpark (its V1 runner refuses it), so as a labelled STAND-IN for serving, vLLM's own
`Gemma4DSparkForCausalLM` loads our checkpoint through its weight loader and computes our logits.
`benchmarks/gpu_check.py` serves it for real where a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from engine.errors import WorkbenchError
from testkit.cli import cli_ok
from tiny import save_tiny_target

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = ROOT / "tests" / "testkit" / "vllm_gemma4_dspark.py"  # run by vLLM's interpreter, not imported
PROMPTS = ["Tell me about the quick brown fox.", "1 2 3 4 5 6", "def add(a, b):"]


def _generated(capsys, *argv: str) -> tuple[list[int], int]:
    out = cli_ok(capsys, "generate", *argv, "--max-new-tokens", "32", "--k", "3", "--dtype", "fp32", "--events")
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [t for e in events for t in e["tokens"]], sum(e.get("accepted", 0) for e in events)


@pytest.fixture(scope="module")
def gemma4_target(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("gemma4") / "target", "gemma4_text")


def test_a_gemma4_target_gets_the_gemma4_layout_trained_and_lossless(gemma4_target, tmp_path, capsys):
    # layers 2-4: the draft reads the target's last layers (one middle layer leaves a random target unpredictable)
    cli_ok(capsys, "extract", "--target", str(gemma4_target), "--dataset", "sharegpt", "--max-samples", "60",
           "--max-length", "96", "--dtype", "fp32", "--layers", "2,3,4", "--out", str(tmp_path / "hs"))
    out = cli_ok(capsys, "train", "--data", str(tmp_path / "hs"), "--algo", "dspark", "--epochs", "6",
                 "--lr", "0.003", "--tokens-per-batch", "512", "--num-layers", "1", "--block-size", "4",
                 "--markov-rank", "16", "--max-anchors", "64", "--calibration-blocks", "0",
                 "--out", str(tmp_path / "run"))
    assert "validate: OK" in out
    draft = tmp_path / "run" / "draft"
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["transformer_layer_config"]["model_type"] == "gemma4_text"
    from safetensors import safe_open

    with safe_open(str(draft / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"embed_tokens.weight", "lm_head.weight", "layers.0.post_feedforward_layernorm.weight"} <= names
    assert not any("v_proj" in n for n in names)  # values are the normed key projection
    report = cli_ok(capsys, "validate", str(draft))
    assert "Gemma4DSparkModel only through a folder in its own form" in report
    assert '"model": "VLLM_FORM_DIR"' in report and f"vllm serve {draft}" not in report  # explicit form only

    out = cli_ok(capsys, "evaluate", "--draft", str(draft), "--num-prompts", "2", "--max-new-tokens", "12",
                 "--k", "1,3", "--dtype", "fp32")  # the decoding-exact walk through the Gemma 4 layers
    assert "held-out samples" in out
    accepted = 0
    for prompt in PROMPTS:
        baseline, _ = _generated(capsys, prompt, "--method", "baseline", "--target", str(gemma4_target))
        speculative, ok = _generated(capsys, prompt, "--method", "draft", "--draft", str(draft))
        assert len(baseline) > 4 and speculative == baseline, prompt
        accepted += ok
    assert accepted > 0, "no draft token was accepted: the identity check covered rejections only"


def test_the_layout_follows_the_target_and_refuses_what_vllms_gemma4_class_lacks(gemma4_target, tiny_targets):
    from engine.algos.dspark.args import DSparkArgs
    from engine.algos.dspark.gemma4 import Gemma4DSparkDraft
    from engine.algos.dspark.io import build_dspark
    from engine.targets.loading import load_target

    gemma = load_target(str(gemma4_target))
    counts = torch.arange(gemma.vocab_size, dtype=torch.float32)  # token frequencies for a draft vocabulary
    small = dict(num_layers=1, block_size=4, markov_rank=8)
    assert isinstance(build_dspark(gemma, DSparkArgs(**small), aux_layer_ids=[2, 3]), Gemma4DSparkDraft)
    # auto keeps Qwen3 layers where the Gemma 4 class cannot hold the arguments; an explicit layout is kept
    for args in (DSparkArgs(**small, draft_vocab_size=64), DSparkArgs(**small, draft_layout="qwen3")):
        draft = build_dspark(gemma, args, aux_layer_ids=[2, 3], token_counts=counts)
        assert draft.config.transformer_layer_config["model_type"] == "qwen3"
    llama = load_target(str(tiny_targets["llama"]))
    assert not isinstance(build_dspark(llama, DSparkArgs(**small), aux_layer_ids=[2, 3]), Gemma4DSparkDraft)
    assert isinstance(build_dspark(llama, DSparkArgs(**small, draft_layout="gemma4"), aux_layer_ids=[2, 3]),
                      Gemma4DSparkDraft)
    with pytest.raises(WorkbenchError, match="full vocabulary"):
        build_dspark(gemma, DSparkArgs(**small, draft_layout="gemma4", draft_vocab_size=64), aux_layer_ids=[2, 3])
    with pytest.raises(WorkbenchError, match="full-attention layers only"):
        build_dspark(gemma, DSparkArgs(**small, draft_layout="gemma4", sliding_window=16), aux_layer_ids=[2, 3])


def _random_draft(target, tmp_path: Path, softcap: float | None) -> tuple[Path, object]:
    """A two-layer Gemma 4 layout draft with every weight moved off its initial value (norms, layer scalars and the
    Markov head included), so a tensor loaded into the wrong place shows."""
    from engine.algos.dspark.args import DSparkArgs
    from engine.algos.dspark.io import build_dspark, save_dspark

    draft = build_dspark(target, DSparkArgs(num_layers=2, block_size=4, markov_rank=16), aux_layer_ids=[1, 2, 3],
                         seed=3).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif p.dim() >= 2 and "embed_tokens" not in name:
                p.normal_(0.0, 0.1)
        for i, layer in enumerate(draft.layers):
            layer.layer_scalar.fill_(0.6 + 0.2 * i)
    draft.softcap = softcap
    tlc = {**draft.config.transformer_layer_config, "final_logit_softcapping": softcap}
    folder = save_dspark(draft, tmp_path / "draft", dtype=torch.float32,
                         config_updates={"transformer_layer_config": tlc})
    return folder, draft


def test_serve_plans_vllms_own_form_for_a_gemma4_layout_draft(gemma4_target, tmp_path, monkeypatch):
    import engine.algos  # noqa: F401  (the registry: vLLM's rules per draft type)
    from engine.serve.server import plan_server
    from engine.targets.loading import load_target

    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    folder, _ = _random_draft(load_target(str(gemma4_target)), tmp_path, None)
    plan = plan_server(folder, validate=False)
    assert plan.form == "explicit" and plan.speculative_config["method"] == "dspark"
    own = Path(plan.speculative_config["model"])
    assert own.parent == tmp_path / "runs" / "vllm-forms"
    cfg = json.loads((own / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4DSparkModel"] and cfg["model_type"] == "gemma4_text"
    assert cfg["target_layer_ids"] == [0, 1, 2] and cfg["sample_from_anchor"] is True
    assert (own / "model.safetensors").resolve() == (folder / "model.safetensors").resolve()
    with pytest.raises(WorkbenchError, match="auto form cannot serve it"):
        plan_server(folder, validate=False, form="auto")
    from ui.serving import forms

    assert forms(str(folder)) == ["explicit"] and forms(None) == ["auto", "explicit"]  # the Serve page's choices


def test_validate_refuses_a_gemma4_layout_vllm_cannot_load_and_warns_where_we_cannot_decode(gemma4_target, tmp_path):
    import shutil

    from engine.algos.dspark.io import load_dspark
    from engine.format.validate import validate_draft
    from engine.targets.loading import load_target

    target = load_target(str(gemma4_target))
    folder, _ = _random_draft(target, tmp_path, None)
    assert validate_draft(folder).ok
    for change, field, severity in ((dict(layer_types=["sliding_attention", "full_attention"]), "layer_types",
                                     "errors"), (dict(attention_k_eq_v=False), "layer_types", "errors"),
                                    (dict(hidden_activation="gelu"), "hidden_activation", "warnings")):
        bad = tmp_path / f"bad-{field}-{severity}-{len(change)}-{next(iter(change))}"
        shutil.copytree(folder, bad)
        cfg = json.loads((bad / "config.json").read_text())
        cfg["transformer_layer_config"].update(change)
        (bad / "config.json").write_text(json.dumps(cfg))
        report = validate_draft(bad)
        found = [i for i in getattr(report, severity) if i.field == f"transformer_layer_config.{field}"]
        assert found and report.ok == (severity == "warnings"), (change, report.errors)
        with pytest.raises(WorkbenchError, match=field.replace("layer_types", "full attention")):
            load_dspark(bad, target)  # refused with the reason, not a wrong draft


@pytest.mark.vllm
def test_the_cpu_build_reads_the_own_form_and_refuses_dspark_in_its_words(gemma4_target, tmp_path):
    """`serve` writes vLLM's own form and starts the CPU build on it: vLLM parses the folder (a Gemma 4 config with
    Gemma4DSparkModel) and stops at its runner check with its own words, which `validate` gave first."""
    import sys

    from engine.algos.dspark.config import VLLM_V1_REFUSAL
    from engine.format.validate import validate_draft
    from engine.targets.loading import load_target

    folder, _ = _random_draft(load_target(str(gemma4_target)), tmp_path, None)
    report = validate_draft(folder)
    assert any(VLLM_V1_REFUSAL in w.message and "GPUs only" in w.message for w in report.warnings)
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--draft", str(folder), "--no-validate",
                          "--foreground", "--timeout", "600"], capture_output=True, text=True, timeout=900, cwd=ROOT,
                         env={**os.environ, "WORKBENCH_RUNS": str(tmp_path / "runs")})
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert VLLM_V1_REFUSAL in out.stderr, out.stderr[-3000:]
    assert "Gemma4DSparkModel" in (next((tmp_path / "runs" / "vllm-forms").iterdir()) / "config.json").read_text()


@pytest.mark.vllm
@pytest.mark.parametrize("softcap", [None, 1.0])
def test_stand_in_vllms_gemma4_dspark_class_loads_our_checkpoint_and_gives_our_logits(gemma4_target, tmp_path,
                                                                                      softcap):
    """STAND-IN for serving (the CPU build cannot run DSpark): vLLM builds Gemma4DSparkForCausalLM from the folder
    `serve` writes (its own config parser), loads our tensors with its `load_weights`, and on the same target
    features and tokens gives our corrected logits and confidence logits at every slot of three blocks."""
    from safetensors.torch import load_file, save_file

    from engine.algos.dspark.vllm_form import write_vllm_folder
    from engine.serve.venv import vllm_venv_dir
    from engine.targets.loading import load_target

    python = vllm_venv_dir() / "bin" / "python"
    if not python.exists():
        pytest.skip("no vLLM environment (.venv-vllm)")
    target = load_target(str(gemma4_target))
    folder, draft = _random_draft(target, tmp_path, softcap)
    own = write_vllm_folder(folder, tmp_path / "vllm-form")
    torch.manual_seed(0)
    t = 30
    aux, ids = torch.randn(1, t, draft.fc.in_features), torch.randint(3, target.vocab_size, (1, t))
    anchors = torch.tensor([5, 12, 20])
    save_file({"aux": aux[0], "ids": ids[0], "anchors": anchors}, str(tmp_path / "in.safetensors"))
    run = subprocess.run([str(python), "-P", str(STAND_IN), str(own), str(tmp_path / "in.safetensors"),
                          str(tmp_path / "out.safetensors"), str(gemma4_target)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = load_file(str(tmp_path / "out.safetensors"))
    with torch.no_grad():
        logits, confidence = draft(aux, ids, torch.arange(t)[None], torch.zeros_like(ids), anchors)
    assert not theirs["causal"].any()  # bidirectional in the block, as ours
    assert theirs["logits"].shape == logits.shape
    assert (theirs["logits"] - logits).abs().max() <= 1e-4 * max(1.0, float(logits.abs().max()))
    assert (theirs["confidence"] - confidence).abs().max() <= 1e-4
    if softcap:  # head and Markov bias capped separately, as vLLM does; the cap moves these logits
        draft.softcap = None
        with torch.no_grad():
            uncapped, _ = draft(aux, ids, torch.arange(t)[None], torch.zeros_like(ids), anchors)
        assert (uncapped - logits).abs().max() > 0.1 and logits.abs().max() > softcap
