"""The answer store (engine.measure.answers): a second evaluation of the same target and prompts reads the target's
answers instead of decoding again and gives equal numbers; a changed target or dtype decodes again; the store is
bounded and ignores entries it cannot read."""

from __future__ import annotations

import shutil

import pytest
import torch

from engine.algos.eagle3.args import Eagle3Args
from engine.measure import answers
from engine.measure import evaluate as ev
from engine.measure.options import EvaluateOptions


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def decodes(monkeypatch):
    """samples_from_prompts as it is, counted (each call = the target decoding every prompt)."""
    calls = []
    real = ev.samples_from_prompts

    def counted(*args, **kwargs):
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "samples_from_prompts", counted)
    return calls


@pytest.fixture
def target_and_draft(tiny_targets, tmp_path):
    from engine.algos.eagle3.io import build_eagle3, save_eagle3
    from engine.targets.loading import load_target

    folder = tmp_path / "target"
    shutil.copytree(tiny_targets["llama"], folder)
    target = load_target(str(folder))
    counts = torch.arange(target.vocab_size).flip(0)
    torch.manual_seed(0)
    draft = build_eagle3(target, Eagle3Args(draft_vocab_size=160), token_counts=counts, aux_layer_ids=[1, 2, 3])
    return folder, save_eagle3(draft, tmp_path / "draft", dtype=torch.float32)


def _evaluate(folder, draft, dtype="fp32"):
    options = EvaluateOptions(draft=str(draft), target=str(folder), num_prompts=3, max_new_tokens=12, k=[1, 2, 3],
                              dtype=dtype)
    return ev.evaluate_draft(options, progress=False)


def test_a_second_evaluation_reads_the_answers_and_a_changed_target_or_dtype_does_not(home, decodes,
                                                                                     target_and_draft):
    folder, draft = target_and_draft
    first = _evaluate(folder, draft)
    assert len(decodes) == 1 and len(list((home / "answers").glob("*.safetensors"))) == 1
    second = _evaluate(folder, draft)
    assert len(decodes) == 1  # read from the store
    assert second["by_k"] == first["by_k"] and second["num_samples"] == first["num_samples"]
    _evaluate(folder, draft, dtype="bf16")
    assert decodes == [torch.float32, torch.bfloat16]  # another dtype: decoded again
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    name = next(n for n in weights if n.endswith("layers.0.mlp.down_proj.weight"))
    weights[name] = weights[name] * 1.5  # same folder, other weights
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _evaluate(folder, draft)
    assert len(decodes) == 3
    assert len(list((home / "answers").glob("*.safetensors"))) == 3


def test_the_recipe_curve_reads_the_answers_evaluate_kept(home, decodes, target_and_draft):
    """The curve's entry point (held_out_answers, as engine.recipes.recipe.acceptance_curve calls it) decodes
    nothing for prompts an evaluation already answered, and returns the same samples."""
    from engine.algos.loading import draft_algorithm
    from engine.data.prompts.load import load_prompts
    from engine.generate.kernel_choice import load_decode_target

    folder, draft = target_and_draft
    _evaluate(folder, draft)
    target = load_decode_target(str(folder), "fp32")
    algorithm = draft_algorithm(draft)
    ids = algorithm.aux_layer_ids(algorithm.load(draft, target))  # the layers evaluate read
    kept = ev.held_out_answers(target, load_prompts("sharegpt", 3), ids, 12)
    assert len(decodes) == 1
    fresh = ev.samples_from_prompts(target, load_prompts("sharegpt", 3), ids, max_new_tokens=12)
    assert [s.token_ids.tolist() for s in kept] == [s.token_ids.tolist() for s in fresh]
    assert all(torch.equal(a.aux, b.aux) for a, b in zip(kept, fresh, strict=True))


def _rows(n: int, width: int = 8) -> list[dict]:
    return [{"token_ids": torch.arange(10 + i), "aux": torch.randn(10 + i, width), "prompt_len": 4, "end": 9 + i,
             "id": str(i)} for i in range(n)]


def test_entries_round_trip_are_bounded_and_unreadable_ones_are_ignored(home, monkeypatch):
    rows = _rows(3)
    key = {"format": answers.STORE_FORMAT, "case": 1}
    answers.save(key, rows)
    back = answers.load(key)
    assert [r["id"] for r in back] == ["0", "1", "2"]
    for a, b in zip(rows, back, strict=True):
        assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["aux"], b["aux"])
        assert (a["prompt_len"], a["end"]) == (b["prompt_len"], b["end"])
    assert answers.load({**key, "case": 2}) is None
    answers.entry_path({**key, "case": 3}).write_bytes(b"not safetensors")
    assert answers.load({**key, "case": 3}) is None
    # a file holding another key under this key's name (a hash collision, a hand copy) is not served
    shutil.copy(answers.entry_path(key), answers.entry_path({**key, "case": 4}))
    assert answers.load({**key, "case": 4}) is None
    one = answers.entry_path(key).stat().st_size
    import os

    for age, case in enumerate([1, 3, 4]):  # used long ago, oldest first (file times may be coarser than this test)
        os.utime(answers.entry_path({**key, "case": case}), (1000 + age, 1000 + age))
    monkeypatch.setenv("WORKBENCH_ANSWERS_MAX_MB", str(1.5 * one / 2**20))
    answers.save({**key, "case": 5}, rows)  # over the bound with the first: the least recently used goes
    kept = {p.name for p in (home / "answers").glob("*.safetensors")}
    assert answers.entry_path({**key, "case": 5}).name in kept and answers.entry_path(key).name not in kept
    monkeypatch.setenv("WORKBENCH_ANSWERS_MAX_MB", "0.0001")
    assert answers.save({**key, "case": 6}, _rows(2, width=4096)) is None  # larger than the whole bound: not kept


def test_pruning_never_touches_a_file_the_store_did_not_write(home, monkeypatch):
    """A user's own files in the store's folder (any name, safetensors or not) survive a prune to zero bytes."""
    from safetensors.torch import save_file

    folder = home / "answers"
    folder.mkdir(parents=True)
    theirs = {folder / "notes.safetensors": None, folder / ("ab" * 12 + ".safetensors"): None, folder / "x.txt": None}
    save_file({"w": torch.ones(4)}, str(folder / "notes.safetensors"))
    save_file({"w": torch.ones(4)}, str(folder / ("ab" * 12 + ".safetensors")))  # an entry's name, not our metadata
    (folder / "x.txt").write_text("mine")
    for path in theirs:
        theirs[path] = path.read_bytes()
    ours = answers.save({"format": answers.STORE_FORMAT, "case": "user"}, _rows(2))
    answers.prune(0)
    assert not ours.exists()  # the store's own entry goes
    assert {p: p.read_bytes() for p in theirs} == theirs  # the user's files are untouched
