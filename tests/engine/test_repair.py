"""`python -m engine repair`: a draft without its embedding gets the verifier's, in place only where the workbench
wrote it; the shipped EAGLE-3 draft stores it and loads in speculators 0.9.0 with our logits and our acceptance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.measure.options import EvaluateOptions

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "assets" / "drafts" / "smollm2-135m-instruct-eagle3"
EMBED = "embed_tokens.weight"


def _slim_draft(target, folder: Path) -> Path:
    """An EAGLE-3 draft saved the old way, without embed_tokens (bf16 like shipped drafts)."""
    from engine.algos import ALGOS
    from engine.algos.eagle3.args import Eagle3Args

    algo = ALGOS.get("eagle3")
    draft = algo.build(target, Eagle3Args(save_embeddings=False), aux_layer_ids=[1, 2, 3], token_counts=None, seed=0)
    return algo.save(draft, folder)


def _embed_warnings(folder: Path) -> list:
    from engine.format.validate import validate_draft

    return [w for w in validate_draft(folder).warnings if w.field == f"tensor:{EMBED}"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "repair", *args], capture_output=True, text=True, cwd=ROOT)


def test_the_warning_names_the_repair_command_and_the_command_clears_it(tiny_targets, tiny_llama, tmp_path):
    from safetensors.torch import load_file

    from engine.format.checkpoint import tensor_index

    folder = _slim_draft(tiny_llama, tmp_path / "slim")
    before = load_file(str(folder / "model.safetensors"))
    [warning] = _embed_warnings(folder)
    assert f"python -m engine repair {folder}" in warning.message
    proc = _cli(str(folder), "--target", str(tiny_targets["llama"]))
    assert proc.returncode == 0, proc.stderr
    after = load_file(str(folder / "model.safetensors"))
    assert set(after) - set(before) == {EMBED} and after[EMBED].dtype == before["fc.weight"].dtype
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing else changed
    want = tiny_llama.embed_tokens().weight.detach().to(after[EMBED].dtype)
    assert torch.equal(after[EMBED], want)
    assert not _embed_warnings(folder) and EMBED in tensor_index(folder)
    assert _cli(str(folder), "--target", str(tiny_targets["llama"])).stdout.startswith("nothing to repair")


def test_a_folder_the_workbench_did_not_write_is_repaired_only_into_a_new_folder(tiny_targets, tiny_llama, tmp_path):
    folder = _slim_draft(tiny_llama, tmp_path / "theirs")
    (folder / ".workbench-owned.json").unlink()  # a user's folder now
    (folder / "notes.txt").write_text("mine")
    weights = (folder / "model.safetensors").read_bytes()
    proc = _cli(str(folder), "--target", str(tiny_targets["llama"]))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not written by the workbench" in proc.stderr and "--out" in proc.stderr
    assert (folder / "model.safetensors").read_bytes() == weights and (folder / "notes.txt").read_text() == "mine"
    out = tmp_path / "repaired"
    proc = _cli(str(folder), "--target", str(tiny_targets["llama"]), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (folder / "model.safetensors").read_bytes() == weights  # the source is left as it was
    assert not _embed_warnings(out)


def test_a_verifier_of_another_shape_is_refused_with_both_shapes(tiny_llama, builtin_target, tmp_path):
    folder = _slim_draft(tiny_llama, tmp_path / "slim")
    weights = (folder / "model.safetensors").read_bytes()
    proc = _cli(str(folder), "--target", "smollm2-135m-instruct")  # [49152, 576] against the tiny [384, 64]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "[49152, 576]" in proc.stderr and f"[{tiny_llama.vocab_size}, {tiny_llama.hidden_size}]" in proc.stderr
    assert (folder / "model.safetensors").read_bytes() == weights


@pytest.fixture(scope="module")
def slim_shipped(tmp_path_factory) -> Path:
    """The shipped EAGLE-3 draft as it was shipped before issue 31: the same weights without the stored embedding
    (one model.safetensors, bf16)."""
    from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint

    state = load_state_dict(SHIPPED)
    del state[EMBED]
    return save_checkpoint(tmp_path_factory.mktemp("slim") / "eagle3", read_config_dict(SHIPPED), state)


def test_the_shipped_draft_stores_the_targets_embedding_and_repair_gives_a_slim_copy_the_same(
        builtin_target, slim_shipped, tmp_path):
    """No warning about the shipped files: they store the target's embedding (bf16, in a shard of its own). A copy
    without it is warned about, and `repair` writes back exactly the stored one."""
    from engine.format.checkpoint import load_state_dict, tensor_index

    assert not _embed_warnings(SHIPPED) and EMBED in tensor_index(SHIPPED)
    stored = load_state_dict(SHIPPED)[EMBED]
    assert stored.dtype == torch.bfloat16
    assert torch.equal(stored, builtin_target.embed_tokens().weight.detach().to(torch.bfloat16))
    [warning] = _embed_warnings(slim_shipped)
    assert "python -m engine repair" in warning.message
    proc = _cli(str(slim_shipped), "--out", str(tmp_path / "repaired"))
    assert proc.returncode == 0, proc.stderr
    assert not _embed_warnings(tmp_path / "repaired")
    assert torch.equal(load_state_dict(tmp_path / "repaired")[EMBED], stored)


@pytest.fixture(scope="module")
def held_out(builtin_target):
    """8 held-out ShareGPT prompts answered greedily by the built-in target (64 new tokens), with the states the
    shipped draft reads (engine.measure.answers keeps them for the next run)."""
    from engine.data.prompts.load import load_prompts
    from engine.format.checkpoint import read_config_dict
    from engine.measure.evaluate import held_out_answers

    layers = sorted(read_config_dict(SHIPPED)["eagle_aux_hidden_state_layer_ids"])
    return held_out_answers(builtin_target, load_prompts("sharegpt", 8), layers, 64)


@pytest.mark.speculators
def test_speculators_loads_the_shipped_draft_with_its_stored_embedding_and_accepts_as_our_engine(
        builtin_target, slim_shipped, held_out):
    """speculators 0.9.0 on the shipped files as they are (sharded, the embedding stored): its embedding is the
    stored one (not random), its logits over the training-time-test steps equal ours, and the decoding-exact
    acceptance its logits give on held-out prompts is ours. The same weights without the embedding draft worse
    there: why the shipped files store it."""
    pytest.importorskip("speculators")
    from engine.algos import ALGOS
    from engine.format.checkpoint import load_state_dict
    from engine.measure.evaluate import evaluate_samples
    from speculators_ref import ReferenceEagle3, load_reference, logit_gaps

    # the hub id's files are not on this offline machine: speculators reads the verifier's lm_head/norm from the
    # built-in target's local folder instead
    ref = load_reference(SHIPPED, verifier_path=builtin_target.ref.path)
    stored = load_state_dict(SHIPPED)[EMBED].float()
    assert torch.equal(ref.embed_tokens.weight.detach().float(), stored)
    algorithm = ALGOS.get("eagle3")
    ours = algorithm.load(SHIPPED, builtin_target, dtype=torch.float32)
    assert max(logit_gaps(ref, ours, builtin_target.vocab_size, tokens=31, steps=3)) <= 1e-3

    def tau(algo) -> float:
        result = evaluate_samples(algo, ours, held_out, [3], EvaluateOptions(max_new_tokens=64))
        return result["by_k"]["3"]["mean_acceptance_length"]

    mine, theirs = tau(algorithm), tau(ReferenceEagle3(algorithm, ref))
    assert mine > 1.2 and abs(theirs - mine) <= 0.01, (mine, theirs)
    random_embedding = ReferenceEagle3(algorithm, load_reference(slim_shipped, verifier_path=builtin_target.ref.path))
    assert tau(random_embedding) < mine - 0.1


def test_a_draft_naming_no_verifier_asks_for_target(tiny_llama, tmp_path):
    folder = _slim_draft(tiny_llama, tmp_path / "slim")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["speculators_config"]["verifier"].pop("name_or_path", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    proc = _cli(str(folder))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--target" in proc.stderr
