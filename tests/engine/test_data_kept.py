"""Regenerated rows kept in the repository: written once, seeded on another machine, never mixed across settings."""

from __future__ import annotations

import gzip
import json

import pytest

import engine.data.answers.regenerate as rg
from engine.data.answers import kept
from engine.data.options import RegenerateOptions
from engine.errors import WorkbenchError

CHATS = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i}?"}]} for i in range(4)]
OPTIONS = {"target": "tiny", "max_new_tokens": 8}


@pytest.fixture
def answered(monkeypatch):
    """Deterministic answers; records every history the target was asked to answer."""
    asked = []

    def fake(target, histories, **kw):
        asked.extend(h[-1]["content"] for h in histories)
        return [(f"answer to {h[-1]['content']}", 3, True) for h in histories]

    monkeypatch.setattr(rg, "generate_answers", fake)
    return asked


def test_kept_rows_seed_another_machine_which_pays_only_the_new_rows(tiny_llama, tmp_path, answered,
                                                                      monkeypatch):
    rg.regenerate(tiny_llama, CHATS[:2], RegenerateOptions(out=tmp_path / "m1.jsonl"), progress=False)
    prov = kept.keep("r", tmp_path / "m1.jsonl", OPTIONS, tmp_path / "kept")
    first = (tmp_path / "kept" / "r.jsonl.gz").read_bytes()
    assert prov["rows"] == 2 and prov["settings"]["max_new_tokens"] == 8
    provenance = (tmp_path / "kept" / "r.provenance.json").read_bytes()
    monkeypatch.setattr(kept.time, "strftime", lambda *a: "a later time")
    kept.keep("r", tmp_path / "m1.jsonl", OPTIONS, tmp_path / "kept")
    assert (tmp_path / "kept" / "r.jsonl.gz").read_bytes() == first  # same rows, same bytes (no timestamp)
    assert (tmp_path / "kept" / "r.provenance.json").read_bytes() == provenance  # nothing new: not rewritten
    answered.clear()
    assert kept.seed("r", tmp_path / "m2.jsonl", OPTIONS, tmp_path / "kept") == 2  # the other machine
    summary = rg.regenerate(tiny_llama, CHATS, RegenerateOptions(out=tmp_path / "m2.jsonl"), progress=False)
    assert answered == ["question 2?", "question 3?"] and summary.already_done == 2
    rows = [json.loads(x) for x in (tmp_path / "m2.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["c0", "c1", "c2", "c3"]
    assert kept.seed("r", tmp_path / "m2.jsonl", OPTIONS, tmp_path / "kept") == 0  # nothing it lacks


def test_other_settings_are_not_mixed_in_and_a_changed_file_is_refused(tiny_llama, tmp_path, answered):
    rg.regenerate(tiny_llama, CHATS[:2], RegenerateOptions(out=tmp_path / "m1.jsonl"), progress=False)
    kept.keep("r", tmp_path / "m1.jsonl", OPTIONS, tmp_path / "kept")
    assert kept.seed("r", tmp_path / "m2.jsonl", {**OPTIONS, "max_new_tokens": 16}, tmp_path / "kept") == 0
    assert not (tmp_path / "m2.jsonl").exists()
    gz = tmp_path / "kept" / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(gzip.decompress(gz.read_bytes()).replace(b"answer", b"ANSWER")))
    with pytest.raises(WorkbenchError, match="sha256"):
        kept.seed("r", tmp_path / "m2.jsonl", OPTIONS, tmp_path / "kept")


def test_a_users_file_under_the_kept_name_is_refused_untouched(tiny_llama, tmp_path, answered):
    rg.regenerate(tiny_llama, CHATS[:1], RegenerateOptions(out=tmp_path / "m1.jsonl"), progress=False)
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "r.jsonl.gz").write_bytes(b"mine")
    with pytest.raises(WorkbenchError, match="did not write"):
        kept.keep("r", tmp_path / "m1.jsonl", OPTIONS, tmp_path / "kept")
    assert (tmp_path / "kept" / "r.jsonl.gz").read_bytes() == b"mine"


def test_a_recipe_keeps_its_rows_and_a_fresh_work_folder_starts_from_them(tiny_targets, tmp_path, answered):
    from engine.recipes.recipe import run_recipe

    def recipe(work, samples):
        path = tmp_path / f"{work}.yaml"
        path.write_text(f"name: kept-test\nwork: {tmp_path / work}\ntarget: {tiny_targets['llama']}\n"
                        f"keep_regenerated: {tmp_path / 'kept'}\n"
                        f"regenerate: {{max_samples: {samples}, max_new_tokens: 4}}\n")
        return str(path)

    run_recipe(recipe("machine1", 2), only=["regenerate"])
    assert json.loads((tmp_path / "kept" / "kept-test.provenance.json").read_text())["rows"] == 2
    asked_before = len(answered)
    run_recipe(recipe("machine2", 3), only=["regenerate"])  # another machine, more data
    assert len(answered) - asked_before == 1  # only the new conversation was generated
    assert len((tmp_path / "machine2" / "regenerated.jsonl").read_text().splitlines()) == 3
    assert json.loads((tmp_path / "kept" / "kept-test.provenance.json").read_text())["rows"] == 3
    asked_before = len(answered)
    run_recipe(recipe("machine3", 1), only=["regenerate"])  # a smaller run: its own selection only
    assert len(answered) == asked_before
    assert len((tmp_path / "machine3" / "regenerated.jsonl").read_text().splitlines()) == 1
    assert json.loads((tmp_path / "kept" / "kept-test.provenance.json").read_text())["rows"] == 3  # not shrunk


def test_a_recipe_kept_as_another_recipes_name_starts_from_that_recipes_rows(tiny_targets, tmp_path, answered):
    from engine.recipes.recipe import run_recipe

    def recipe(name, extra=""):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nwork: {tmp_path / name}\ntarget: {tiny_targets['llama']}\n"
                        f"keep_regenerated: {tmp_path / 'kept'}\n{extra}"
                        f"regenerate: {{max_samples: 2, max_new_tokens: 4}}\n")
        return str(path)

    run_recipe(recipe("first"), only=["regenerate"])
    asked_before = len(answered)
    run_recipe(recipe("second", "kept_as: first\n"), only=["regenerate"])
    assert len(answered) == asked_before  # its rows came from the first recipe's kept file
    assert len((tmp_path / "second" / "regenerated.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "kept" / "second.jsonl.gz").exists()
    from engine.recipes.model_card import _seeded

    marker = json.loads((tmp_path / "second" / "steps" / "regenerate.json").read_text())
    assert marker["seeded_rows"] == 2 and "2 rows taken from the kept ones" in _seeded(marker)  # the card says so


def test_the_eagle3_recipes_kept_rows_are_four_times_the_shipped_drafts_conversations():
    """docs/data-files.md's claim: the committed EAGLE-3 rows match their sha256, were answered with the settings the
    recipe's regenerate step runs with, have distinct ids and number at least 4 x the 2,689 conversations the first
    draft was trained on, all inside the first 12,000 train samples, which the recipe asks for
    (`max_samples: 12000`)."""
    from engine.recipes.spec import load_recipe, step_options

    regenerate = dict(step_options(load_recipe("smollm2-eagle3")))["regenerate"]
    lines, provenance = kept.read_kept("smollm2-eagle3")
    assert provenance["settings"] == kept.answer_settings(regenerate)
    ids = [json.loads(line)["id"] for line in lines]
    assert len(set(ids)) == len(ids) == provenance["rows"] >= 4 * 2689
    assert regenerate["max_samples"] == 12000 and set(ids) <= kept.selection_ids(regenerate)
