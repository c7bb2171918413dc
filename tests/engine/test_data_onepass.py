"""One-pass regeneration + extraction: the same JSONL and extraction folder as `regenerate` then `extract`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import engine.data.answers.onepass as op
from engine.data.answers.regenerate import regenerate
from engine.data.extract.dataset import extract_hidden_states
from engine.data.options import ExtractOptions, RegenerateOptions
from engine.data.render.chat import render_dataset
from engine.data.store.files import read_manifest, sample_indices
from engine.errors import WorkbenchError
from engine.fsutil import tensors_digest_of
from testkit.chats import CHATS as REGENERATE_CHATS

CHATS = [*REGENERATE_CHATS,  # a multi-turn, a single-turn and a short conversation, as the regenerate tests use
         {"id": "fourth", "messages": [{"role": "user", "content": "def add(a, b): what does it return?"}]}]
# bf16 files: both ways round the same fp32 states to bf16; a last-bit difference in fp32 can flip one rounding
BF16_TOLERANCE = 2 ** -7  # relative to the value's magnitude (one bf16 step); checked with rtol below


def two_steps(target, chats, tmp, layer_ids, *, max_new_tokens, batch_size, max_length, dtype="bf16"):
    """What users run today: regenerate, then extract --split all of its JSONL."""
    out = tmp / "two.jsonl"
    regenerate(target, chats, RegenerateOptions(out=out, max_new_tokens=max_new_tokens, batch_size=batch_size),
               progress=False)
    rows, _, _ = render_dataset(str(out), target.tokenizer, split="all", max_length=max_length)
    extract_hidden_states(target, rows, ExtractOptions(out=tmp / "two", dtype=dtype), layer_ids, progress=False,
                          header_extra={"dataset": str(out), "split": "all", "max_length": max_length, "seed": 0,
                                        "val_fraction": 0.02, "algo": None})
    return out, tmp / "two"


def read_rows(path):
    return [{k: r[k] for k in ("id", "messages")} for r in map(json.loads, path.read_text().splitlines())]


def read_file(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def assert_same_folders(a, b, *, rtol, atol) -> float:
    """Same sample files (keys, shapes, dtypes, token ids, loss masks, metadata) and close states; max |diff|."""
    assert sample_indices(a) == sample_indices(b) and sample_indices(a)
    worst = 0.0
    for i in sample_indices(a):
        (x, mx), (y, my) = read_file(a / f"hs_{i}.safetensors"), read_file(b / f"hs_{i}.safetensors")
        assert sorted(x) == sorted(y) == ["hidden_states", "loss_mask", "token_ids"]
        # same metadata; each file's digest is of its own tensors (the states are close, not bitwise)
        assert {k: v for k, v in mx.items() if k != "sha256"} == {k: v for k, v in my.items() if k != "sha256"}
        assert mx["sha256"] == tensors_digest_of(x) and my["sha256"] == tensors_digest_of(y)
        assert {k: (v.dtype, v.shape) for k, v in x.items()} == {k: (v.dtype, v.shape) for k, v in y.items()}
        assert torch.equal(x["token_ids"], y["token_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        torch.testing.assert_close(x["hidden_states"].float(), y["hidden_states"].float(), rtol=rtol, atol=atol)
        worst = max(worst, (x["hidden_states"].float() - y["hidden_states"].float()).abs().max().item())
    ma, mb = read_manifest(a), read_manifest(b)
    for k in ("format", "target", "layer_ids", "aux_layer_ids", "hidden_size", "dtype", "max_length", "split",
              "samples", "tokens", "loss_tokens", "complete", "token_ids_dtype", "loss_mask_dtype"):
        assert ma[k] == mb[k], k
    assert torch.equal(read_file(a / "token_freq.safetensors")[0]["counts"],
                       read_file(b / "token_freq.safetensors")[0]["counts"])
    return worst


def decode_with_transformers(monkeypatch) -> None:
    """The one pass and regenerate take transformers' decoding, as for a target the fused decoder does not take."""
    import engine.data.answers.regenerate as rg

    for module in (op, rg):
        monkeypatch.setattr(module, "fused_batch_problem", lambda model: "forced by the test")


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("fused", [True, False])
def test_same_jsonl_and_folder_as_regenerate_then_extract_tiny(tiny_llama, tmp_path, batch_size, fused, monkeypatch):
    if not fused:
        decode_with_transformers(monkeypatch)
    layer_ids = [0, 2, tiny_llama.num_layers]
    out2, folder2 = two_steps(tiny_llama, CHATS, tmp_path, layer_ids, max_new_tokens=12, batch_size=batch_size,
                              max_length=200, dtype="fp32")
    out1 = tmp_path / "one.jsonl"
    summary = op.regenerate_and_extract(tiny_llama, CHATS,
                                        RegenerateOptions(out=out1, extract_to=tmp_path / "one", max_new_tokens=12,
                                                          batch_size=batch_size, extract_max_length=200, dtype="fp32"),
                                        layer_ids, progress=False)
    assert read_rows(out1) == read_rows(out2)  # greedy answers equal, so the JSONL is the same
    backends = {json.loads(line)["regenerated"]["backend"] for line in out1.read_text().splitlines()}
    assert backends == {"fused-onepass" if fused else "transformers-onepass"}
    assert summary.extracted == len(sample_indices(folder2))
    # fp32 files: the states of KV-cached decoding and of one full forward differ only in the last bits
    assert assert_same_folders(tmp_path / "one", folder2, rtol=1e-4, atol=1e-5) < 1e-4


@pytest.mark.parametrize("fused", [True, False])
def test_rendered_tokens_differing_from_the_fed_ones_are_run_on_the_cache(tiny_llama, tmp_path, monkeypatch, fused):
    """The rows' tokens after the answer (end-of-turn marker, newline) were never fed: they go through the tail."""
    calls = []
    name = "_fused_tail" if fused else "_tail"
    tail = getattr(op.CapturingAnswerer, name)
    monkeypatch.setattr(op.CapturingAnswerer, name, lambda self, ids, p, **kw: calls.append(
        (len(ids), p)) or tail(self, ids, p, **kw))
    if not fused:
        decode_with_transformers(monkeypatch)
    op.regenerate_and_extract(tiny_llama, CHATS[1:3],
                              RegenerateOptions(out=tmp_path / "o.jsonl", extract_to=tmp_path / "o", max_new_tokens=6,
                                                extract_max_length=200), [1], progress=False)
    assert calls and all(0 < p < n for n, p in calls)  # a prefix came from generation, the rest from the cache


@pytest.mark.parametrize("fused", [True, False])
def test_resume_after_interruption_gives_the_uninterrupted_result(tiny_llama, tmp_path, monkeypatch, fused):
    """A crash after the JSONL got a call's rows but before all their samples: the next run extracts the missing
    samples the ordinary way and regenerates the rest (the fused batch gets FUSED_GROUP batches per call)."""
    import engine.data.answers.regenerate as rg

    if not fused:
        decode_with_transformers(monkeypatch)
    in_file = min(len(CHATS), rg.FUSED_GROUP) if fused else 2  # rows in the JSONL when the second sample is added
    layer_ids = [1, tiny_llama.num_layers]
    kw = dict(max_new_tokens=8, batch_size=1, extract_max_length=200)
    op.regenerate_and_extract(tiny_llama, CHATS,
                              RegenerateOptions(out=tmp_path / "full.jsonl", extract_to=tmp_path / "full", **kw),
                              layer_ids, progress=False)
    real_add = op.GrowingExtractionRun.add
    added = []

    def crash_after_two(self, row, hs):  # the second conversation is in the JSONL, its sample is not
        if len(added) == 1:
            raise KeyboardInterrupt
        added.append(row.id)
        return real_add(self, row, hs)

    monkeypatch.setattr(op.GrowingExtractionRun, "add", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        op.regenerate_and_extract(tiny_llama, CHATS,
                                  RegenerateOptions(out=tmp_path / "part.jsonl", extract_to=tmp_path / "part", **kw),
                                  layer_ids, progress=False)
    assert len(read_rows(tmp_path / "part.jsonl")) == in_file and sample_indices(tmp_path / "part") == [0]
    assert read_manifest(tmp_path / "part")["complete"] is False
    monkeypatch.setattr(op.GrowingExtractionRun, "add", real_add)
    summary = op.regenerate_and_extract(tiny_llama, CHATS,
                                        RegenerateOptions(out=tmp_path / "part.jsonl", extract_to=tmp_path / "part",
                                                          **kw), layer_ids, progress=False)
    assert summary.already_done == in_file and summary.written == len(CHATS) - in_file
    assert read_rows(tmp_path / "part.jsonl") == read_rows(tmp_path / "full.jsonl")
    assert_same_folders(tmp_path / "part", tmp_path / "full", rtol=2 ** -7, atol=1e-5)
    assert read_manifest(tmp_path / "part")["complete"] is True


def test_a_users_file_in_the_folder_is_refused_untouched(tiny_llama, tmp_path):
    folder = tmp_path / "hs"
    folder.mkdir()
    (folder / "hs_1.safetensors").write_bytes(b"mine")
    with pytest.raises(WorkbenchError, match="did not write"):
        op.regenerate_and_extract(tiny_llama, CHATS,
                                  RegenerateOptions(out=tmp_path / "o.jsonl", extract_to=folder, max_new_tokens=4), [1],
                                  progress=False)
    assert (folder / "hs_1.safetensors").read_bytes() == b"mine" and not (tmp_path / "o.jsonl").exists()


def test_sampling_and_vllm_are_refused_with_a_hint(tmp_path):
    from engine.data.answers.dataset import regenerate_dataset

    for kw in ({"temperature": 0.7}, {"backend": "vllm"}):
        with pytest.raises(WorkbenchError, match="greedily") as e:
            regenerate_dataset(RegenerateOptions(out=str(tmp_path / "o.jsonl"), extract_to=str(tmp_path / "hs"), **kw))
        assert "extract" in e.value.hint


def test_cli_regenerate_extract_to(tmp_path):
    from engine.cli import build_parser

    args = build_parser().parse_args(["regenerate", "--out", "o.jsonl", "--extract-to", "hs", "--algo",
                                      "eagle3", "--extract-max-length", "512"])
    assert (args.extract_to, args.algo, args.extract_max_length, args.dtype, args.layers) == (
        "hs", "eagle3", 512, "bf16", None)


def test_builtin_target_short_conversations(builtin_target, tmp_path):
    """Built-in target, 3 short ShareGPT-like conversations (one multi-turn), bf16 files as recipes write."""
    from engine.data.extract.layer_ids import resolve_layer_ids

    chats = [CHATS[0], CHATS[1], {"id": "c", "messages": [{"role": "user", "content": "Name three colours."}]}]
    layer_ids = resolve_layer_ids(builtin_target.num_layers, None, None)
    _, folder2 = two_steps(builtin_target, chats, tmp_path, layer_ids, max_new_tokens=24, batch_size=3,
                           max_length=512)
    op.regenerate_and_extract(builtin_target, chats,
                              RegenerateOptions(out=tmp_path / "one.jsonl", extract_to=tmp_path / "one",
                                                max_new_tokens=24, batch_size=3, extract_max_length=512), layer_ids,
                              progress=False)
    assert read_rows(tmp_path / "one.jsonl") == read_rows(tmp_path / "two.jsonl")
    worst = assert_same_folders(tmp_path / "one", folder2, rtol=2 ** -6, atol=2e-2)
    print(f"built-in target, bf16 files: max |one pass - two steps| = {worst:.3g}")


def test_a_recipe_with_onepass_extracts_while_regenerating(tmp_path):
    """`regenerate: onepass: true` hands the extract step's settings to regenerate (--extract-to the same folder)."""
    from engine.recipes.spec import cli_flags, load_recipe, step_options

    path = tmp_path / "r.yaml"
    path.write_text(f"work: {tmp_path / 'work'}\nregenerate: {{max_samples: 4, onepass: true}}\n"
                    "extract: {algo: eagle3, max_length: 256, dtype: bf16}\n")
    steps = dict(step_options(load_recipe(str(path))))
    regen, extract = steps["regenerate"], steps["extract"]
    assert regen["extract_to"] == extract["out"] == str(tmp_path / "work" / "hidden")
    assert (regen["algo"], regen["extract_max_length"], regen["dtype"]) == ("eagle3", 256, "bf16")
    assert "onepass" not in regen and "--extract-to" in cli_flags(regen)


def test_recipe_steps_run_onepass_and_extract_finds_its_samples(tiny_targets, tmp_path):
    """The recipe's regenerate step writes the samples; its extract step then only checks them (files unchanged)."""
    from engine.recipes.recipe import run_recipe

    path = tmp_path / "r.yaml"
    path.write_text(f"work: {tmp_path / 'work'}\ntarget: {tiny_targets['llama']}\n"
                    "regenerate: {max_samples: 3, max_new_tokens: 6, onepass: true}\n"
                    "extract: {layers: '1,4', max_length: 128, batch_size: 2}\n")
    run_recipe(str(path), only=["regenerate"])
    hidden = tmp_path / "work" / "hidden"
    stamps = {p.name: p.stat().st_mtime_ns for p in hidden.glob("hs_*.safetensors")}
    assert stamps and read_manifest(hidden)["complete"]
    run_recipe(str(path), only=["extract"])
    assert {p.name: p.stat().st_mtime_ns for p in hidden.glob("hs_*.safetensors")} == stamps
    assert read_manifest(hidden)["samples"] == len(stamps)


def test_cli_one_pass_then_extract_of_the_same_file_equals_it(tiny_targets, tmp_path):
    """`regenerate --extract-to` and `extract --split all` of its JSONL into a second folder: equal folders."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def engine(*args):
        proc = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(r) + "\n" for r in CHATS))
    common = ["--target", str(tiny_targets["llama"]), "--layers", "1,4", "--dtype", "fp32"]
    printed = engine("regenerate", *common, "--dataset", str(chats), "--split", "all", "--max-new-tokens", "8",
                     "--out", str(tmp_path / "o.jsonl"), "--extract-to", str(tmp_path / "one"),
                     "--extract-max-length", "100")
    assert json.loads(printed[printed.index("{"):])["extracted"] == len(sample_indices(tmp_path / "one"))
    engine("extract", *common, "--dataset", str(tmp_path / "o.jsonl"), "--split", "all", "--max-length", "100",
           "--out", str(tmp_path / "two"))
    assert assert_same_folders(tmp_path / "one", tmp_path / "two", rtol=1e-4, atol=1e-5) < 1e-4


def test_a_conversation_whose_states_were_not_kept_is_extracted_in_its_place(tiny_llama, tmp_path, monkeypatch):
    """Sample indices must stay those of `extract`: a row without kept states is extracted, not skipped."""
    layer_ids = [1, tiny_llama.num_layers]
    kw = dict(max_new_tokens=8, batch_size=2, extract_max_length=200, dtype="fp32")
    op.regenerate_and_extract(tiny_llama, CHATS,
                              RegenerateOptions(out=tmp_path / "a.jsonl", extract_to=tmp_path / "a", **kw), layer_ids,
                              progress=False)
    keep = op.CapturingAnswerer._keep
    monkeypatch.setattr(op.CapturingAnswerer, "_keep", lambda self, messages, *a: None if "Be brief." in json.dumps(
        messages) else keep(self, messages, *a))
    op.regenerate_and_extract(tiny_llama, CHATS,
                              RegenerateOptions(out=tmp_path / "b.jsonl", extract_to=tmp_path / "b", **kw), layer_ids,
                              progress=False)
    assert assert_same_folders(tmp_path / "b", tmp_path / "a", rtol=1e-4, atol=1e-5) < 1e-4
