"""Folder ownership: a command writing into an existing folder replaces only what the workbench recorded writing.

The record is the owner marker (`engine.fsutil.OWNER_MARKER`), made before the write; a file a user put under one
of the names a command writes is refused by name with the fix, and no file of the user's is changed or deleted.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.data.options import ExtractOptions
from engine.errors import WorkbenchError
from engine.fsutil import OWNER_MARKER, claim_names

# Names a user's file may have: some are names the commands write, some are not.
USER_NAMES = st.sampled_from(["manifest.json", "token_freq.safetensors", "hs_0.safetensors", "hs_1.safetensors",
                              "notes.txt", "data/own.jsonl", "metrics.jsonl", "config.yaml", "draft/config.json",
                              "bench.json", "steps/extract.json", "hs_7.safetensors", ".hidden"])
USER_FILES = st.dictionaries(USER_NAMES, st.binary(min_size=0, max_size=64), max_size=5)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _put(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def _unchanged(folder: Path, files: dict[str, bytes]) -> bool:
    return all((folder / name).is_file() and (folder / name).read_bytes() == data for name, data in files.items())


def _clashes(files: dict[str, bytes], names) -> list[str]:
    return sorted(n for n in names if any(f == n or f.startswith(n + "/") for f in files))


@PROPERTY
@given(files=USER_FILES, names=st.sets(USER_NAMES, max_size=6))
def test_claim_refuses_exactly_the_users_files_under_its_names_and_changes_nothing(files, names):
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "out"
        folder.mkdir()
        _put(folder, files)
        clashes = _clashes(files, names)
        if clashes:
            with pytest.raises(WorkbenchError) as err:
                claim_names(folder, names, kind="test")
            assert clashes[0] in err.value.message and clashes[0] in err.value.hint
            assert not (folder / OWNER_MARKER).exists()  # refused: nothing written
        else:
            claim_names(folder, names, kind="test")
            recorded = json.loads((folder / OWNER_MARKER).read_text())["files"] if names else []
            assert set(recorded) == set(names)  # nothing claimed: no marker either
            claim_names(folder, names, kind="test")  # what it recorded is its own on the next run
        assert _unchanged(folder, files)


def test_claimed_names_stay_ours_after_a_write_and_a_users_new_file_is_still_refused(tmp_path):
    claim_names(tmp_path, ["manifest.json"], kind="test")
    (tmp_path / "manifest.json").write_text("{}")  # the command's own write
    claim_names(tmp_path, ["manifest.json"], kind="test")
    (tmp_path / "bench.json").write_text("mine")
    with pytest.raises(WorkbenchError, match="bench.json"):
        claim_names(tmp_path, ["manifest.json", "bench.json"], kind="test")
    claim_names(tmp_path, ["bench.json"], kind="test", overwrite=True)  # the user's explicit consent
    assert (tmp_path / "bench.json").read_text() == "mine"  # claiming itself never writes a user's file


# -- extract ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_rows(tiny_llama):
    from engine.data.render.chat import render_rows

    chats = [{"id": f"r{i}", "messages": [{"role": "user", "content": "hello there " * (i + 1)},
                                          {"role": "assistant", "content": "general kenobi"}]} for i in range(2)]
    return render_rows(tiny_llama.tokenizer, chats, max_length=64)


def test_extract_refuses_a_folder_holding_the_users_own_manifest(tiny_llama, two_rows, tmp_path):
    from engine.data.extract.dataset import extract_hidden_states

    (tmp_path / "manifest.json").write_text('{"mine": true}')
    with pytest.raises(WorkbenchError, match="manifest.json") as err:
        extract_hidden_states(tiny_llama, two_rows, ExtractOptions(out=tmp_path), [1, 2], progress=False)
    assert "move manifest.json out" in err.value.hint
    assert (tmp_path / "manifest.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # not even a lock file


@PROPERTY
@given(files=USER_FILES)
def test_extract_never_changes_a_users_file(tiny_llama, two_rows, files):
    from engine.data.extract.dataset import extract_hidden_states

    writes = ["manifest.json", "token_freq.safetensors", "hs_0.safetensors", "hs_1.safetensors", "hs_7.safetensors"]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        _put(out, files)
        clashes = _clashes(files, writes)
        if clashes:
            with pytest.raises(WorkbenchError, match=clashes[0].replace(".", r"\.")):
                extract_hidden_states(tiny_llama, two_rows, ExtractOptions(out=out), [1, 2], progress=False)
        else:
            options = ExtractOptions(out=out)
            assert extract_hidden_states(tiny_llama, two_rows, options, [1, 2], progress=False)["samples"] == 2
            assert extract_hidden_states(tiny_llama, two_rows, options, [1, 2], progress=False)["complete"]  # resumes
        assert _unchanged(out, files)


# -- train --out -------------------------------------------------------------------------------------------------


def test_train_refuses_an_out_folder_holding_the_users_metrics(tiny_targets, tmp_path):
    from engine.data.extract.dataset import extract_dataset
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer

    data = tmp_path / "hs"
    extract_dataset(ExtractOptions(target=str(tiny_targets["llama"]), dataset="sharegpt", out=data, algo="eagle3",
                                   max_samples=6, max_length=96, dtype="fp32"), progress=False)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my own log\n")
    cfg = TrainConfig(target=str(tiny_targets["llama"]), data=str(data), out=str(out), tokens_per_batch=128,
                      max_length=96, draft_vocab_size=64, epochs=1, val_fraction=0.2)
    with pytest.raises(WorkbenchError, match="metrics.jsonl"):
        Trainer(cfg).run()
    assert (out / "metrics.jsonl").read_text() == "my own log\n"
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


# -- recipe work folders, remeasure, ship --------------------------------------------------------------------------


def _recipe_file(tmp_path: Path, work: Path, ship: Path) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"name: r\nwork: {work}\ntarget: smollm2-135m-instruct\n"
                    f"bench: {{max_new_tokens: 8, num_prompts: 2}}\nship: {{to: {ship}}}\n")
    return path


def test_a_recipe_refuses_a_work_folder_holding_the_users_file_and_a_dry_run_writes_nothing(tmp_path, capsys):
    from engine.recipes.recipe import run_recipe

    work = tmp_path / "work"
    run_recipe(str(_recipe_file(tmp_path, work, tmp_path / "ship")), dry_run=True)
    assert not work.exists()  # a dry run creates nothing
    work.mkdir()
    (work / "bench.json").write_text("my figures")
    with pytest.raises(WorkbenchError, match="bench.json") as err:
        run_recipe(str(_recipe_file(tmp_path, work, tmp_path / "ship")))
    assert "work:" in err.value.hint
    assert (work / "bench.json").read_text() == "my figures" and sorted(p.name for p in work.iterdir()) == [
        "bench.json"]


def test_a_misspelt_recipe_step_is_refused_before_anything_runs(tmp_path, capsys):
    from engine.cli import main
    from engine.recipes.spec import STEPS

    work = tmp_path / "work"
    assert main(["recipe", str(_recipe_file(tmp_path, work, tmp_path / "ship")), "--only", "bench,evalute"]) != 0
    err = capsys.readouterr().err
    assert "evalute" in err and "Traceback" not in err and ",".join(STEPS) in err
    assert not work.exists()  # nothing ran, nothing was claimed


def test_remeasure_dry_run_prints_the_commands_and_writes_nothing(tmp_path, capsys):
    from engine.cli import main

    ship = tmp_path / "ship"
    ship.mkdir()
    (ship / "config.json").write_text("{}")
    (ship / "model.safetensors").write_bytes(b"weights")
    (ship / "README.md").write_text("card")
    work = tmp_path / "work"
    assert main(["recipe", str(_recipe_file(tmp_path, work, ship)), "--remeasure", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"python -m engine bench --target smollm2-135m-instruct --draft {ship}" in out
    assert not work.exists() and sorted(p.name for p in ship.iterdir()) == ["README.md", "config.json",
                                                                          "model.safetensors"]


def test_remeasure_refuses_a_shipped_card_the_workbench_did_not_write(tmp_path):
    from engine.recipes.recipe import load_recipe, remeasure

    ship = tmp_path / "ship"
    ship.mkdir()
    (ship / "config.json").write_text("{}")
    (ship / "model.safetensors").write_bytes(b"weights")
    (ship / "README.md").write_text("the user's card")
    with pytest.raises(WorkbenchError, match="README.md"):
        remeasure(load_recipe(str(_recipe_file(tmp_path, tmp_path / "work", ship))))
    assert (ship / "README.md").read_text() == "the user's card"


def test_the_shipped_drafts_carry_the_owner_marker_ship_records():
    from engine.fsutil import foreign_files

    drafts = [p for p in (Path(__file__).resolve().parents[2] / "assets" / "drafts").iterdir() if p.is_dir()]
    assert drafts
    for folder in drafts:
        files = {p.name for p in folder.iterdir()} - {OWNER_MARKER}
        assert set(json.loads((folder / OWNER_MARKER).read_text())["files"]) == files
        assert {"config.json", "README.md"} < files and not foreign_files(folder)


# -- convert ---------------------------------------------------------------------------------------------------


def test_convert_does_not_take_a_folder_for_its_own_by_its_file_names(tmp_path):
    from engine.convert.pipeline import convert

    job = tmp_path / "job"
    (job / "draft").mkdir(parents=True)
    (job / ".workbench.lock").write_text("")
    (job / "draft" / "config.json").write_text('{"mine": 1}')
    (job / "draft" / "model.safetensors").write_bytes(b"user weights")
    with pytest.raises(WorkbenchError, match="did not write"):
        convert(tmp_path / "missing-source", job / "draft")
    assert (job / "draft" / "config.json").read_text() == '{"mine": 1}'
    assert (job / "draft" / "model.safetensors").read_bytes() == b"user weights"


# -- the app's uploads -------------------------------------------------------------------------------------------


@PROPERTY
@given(files=USER_FILES, folders=st.sets(st.sampled_from(["convert-abc", ".convert-x.tmp", "convert-", "mine"]),
                                         max_size=3))
def test_pruning_uploads_never_deletes_a_users_file(files, folders):
    from engine.convert.inputs import prune_staged, staged

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for name in folders:
            (root / name).mkdir()
            _put(root / name, files)
        ours = staged(root, "convert-ours", lambda tmp: (tmp / "config.json").write_text("{}"))
        prune_staged(root, now=1e12)  # everything is stale: only what staging wrote may go
        assert not ours.exists()
        for name in folders:
            assert _unchanged(root / name, files)
