"""The target follows the work: training follows the data's manifest, decoding follows the draft's verifier, and a
--target that disagrees with either (layers, width, vocabulary, weights where recorded) is refused naming both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testkit.cli import run_cli
from tiny import save_tiny_target


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Target A (tiny Llama), data extracted from it, a draft trained on that data; and other targets:
    narrower (width), shallower (layers), another vocabulary, and A's shape with other weights."""
    from engine.cli import main

    root = tmp_path_factory.mktemp("follow")
    targets = {"a": save_tiny_target(root / "a", "llama"),
               "narrow": save_tiny_target(root / "narrow", "llama", hidden_size=32),
               "shallow": save_tiny_target(root / "shallow", "llama", num_layers=3),
               "vocab": save_tiny_target(root / "vocab", "llama", vocab_size=320),
               "reseeded": save_tiny_target(root / "reseeded", "llama", seed=1)}
    data = root / "hs"
    assert main(["extract", "--target", str(targets["a"]), "--dataset", "sharegpt", "--max-samples", "8",
                 "--max-length", "64", "--dtype", "fp32", "--out", str(data)]) == 0
    run = root / "run"
    assert main(["train", "--data", str(data), "--max-steps", "2", "--tokens-per-batch", "256",
                 "--warmup-steps", "1", "--val-fraction", "0.25", "--num-layers", "1", "--out", str(run)]) == 0
    return {"targets": {k: str(v) for k, v in targets.items()}, "data": str(data), "draft": str(run / "draft"),
            "root": root}


def test_the_manifest_records_the_digest_of_the_targets_tensors(made):
    from engine.targets.identity import target_digest

    manifest = json.loads((Path(made["data"]) / "manifest.json").read_text())
    assert manifest["target_path"] == str(Path(made["targets"]["a"]).resolve())
    assert manifest["target_digest"] == target_digest(made["targets"]["a"])
    assert target_digest(made["targets"]["a"]) != target_digest(made["targets"]["reseeded"])


def test_training_follows_the_data_and_names_it_in_the_draft(made):
    verifier = json.loads((Path(made["draft"]) / "config.json").read_text())["speculators_config"]["verifier"]
    assert Path(verifier["name_or_path"]).resolve() == Path(made["targets"]["a"]).resolve()


@pytest.mark.parametrize("other,what", [("narrow", "width 64 vs 32"), ("shallow", "layers 4 vs 3"),
                                        ("vocab", "vocabulary 384 vs 320")])
def test_train_refuses_a_target_the_data_was_not_made_for(made, other, what, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "train", "--data", made["data"], "--target", made["targets"][other],
                         "--max-steps", "1", "--tokens-per-batch", "256", "--out", str(tmp_path / "run"))
    assert rc == 2, err
    assert f"--target {made['targets'][other]} is not the target the data was made for" in err
    assert str(Path(made["targets"]["a"]).resolve()) in err and what in err
    assert not (tmp_path / "run" / "draft").exists()


def test_train_refuses_a_target_of_the_datas_shape_with_other_weights(made, tmp_path, capsys):
    from engine.targets.identity import target_digest

    rc, _, err = run_cli(capsys, "train", "--data", made["data"], "--target", made["targets"]["reseeded"],
                         "--max-steps", "1", "--tokens-per-batch", "256", "--out", str(tmp_path / "run"))
    assert rc == 2, err
    assert "are not those the data was made from" in err and target_digest(made["targets"]["reseeded"]) in err
    assert not (tmp_path / "run" / "draft").exists()


def test_train_accepts_the_datas_own_target_given_explicitly(made, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "train", "--data", made["data"], "--target", made["targets"]["a"],
                           "--max-steps", "1", "--tokens-per-batch", "256", "--num-layers", "1",
                           "--out", str(tmp_path / "run"))
    assert rc == 0, err
    assert "validate: OK" in out


def test_data_whose_target_is_gone_asks_for_one(made, tmp_path, capsys):
    data = tmp_path / "hs"
    shutil.copytree(made["data"], data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest.update(target="someone/not-cached-anywhere", target_path=str(tmp_path / "moved-away"))
    (data / "manifest.json").write_text(json.dumps(manifest))
    rc, _, err = run_cli(capsys, "train", "--data", str(data), "--max-steps", "1", "--out", str(tmp_path / "run"))
    assert rc == 2
    assert "extracted from target 'someone/not-cached-anywhere', which is not available here" in err
    assert "pass --target" in err


@pytest.mark.parametrize("command", ["generate", "evaluate", "bench"])
@pytest.mark.parametrize("other,what", [("narrow", "width 64 vs 32"), ("vocab", "vocabulary 384 vs 320")])
def test_decoding_refuses_a_target_the_draft_was_not_made_for(made, command, other, what, capsys):
    argv = {"generate": ["generate", "Hi", "--method", "draft", "--max-new-tokens", "4"],
            "evaluate": ["evaluate", "--num-prompts", "1", "--max-new-tokens", "4"],
            "bench": ["bench", "--methods", "baseline,draft", "--num-prompts", "1", "--max-new-tokens", "4"]}[command]
    rc, _, err = run_cli(capsys, *argv, "--draft", made["draft"], "--target", made["targets"][other],
                         "--dtype", "fp32")
    assert rc == 2, err
    assert f"--target {made['targets'][other]} is not the target the draft was made for" in err
    assert str(Path(made["targets"]["a"]).resolve()) in err and what in err


def test_decoding_follows_the_drafts_verifier(made, monkeypatch):
    from engine.errors import WorkbenchError
    from engine.targets.identity import ACCEPT_CHANGE_ENV, target_for_draft
    from engine.targets.resolve import DEFAULT_TARGET

    a = made["targets"]["a"]
    assert Path(target_for_draft(made["draft"], None)).resolve() == Path(a).resolve()
    assert target_for_draft(made["draft"], a) == a
    # a target of the verifier's shape with other weights: the draft records its verifier's tensors' digest
    with pytest.raises(WorkbenchError, match="are not those the draft was made from"):
        target_for_draft(made["draft"], made["targets"]["reseeded"])
    monkeypatch.setenv(ACCEPT_CHANGE_ENV, "1")  # what --accept-target-change sets
    assert target_for_draft(made["draft"], made["targets"]["reseeded"]) == made["targets"]["reseeded"]
    assert target_for_draft(None, None) is None and target_for_draft(None, DEFAULT_TARGET) == DEFAULT_TARGET


def test_serve_refuses_a_target_the_draft_was_not_made_for(made):
    from engine.errors import WorkbenchError
    from engine.serve.server import plan_server

    with pytest.raises(WorkbenchError, match="is not the target the draft was made for") as info:
        plan_server(made["draft"], target=made["targets"]["narrow"], form="explicit")
    assert "width 64 vs 32" in str(info.value)
    with pytest.raises(WorkbenchError, match="are not those the draft was made from"):
        plan_server(made["draft"], target=made["targets"]["reseeded"], form="explicit")
    plan = plan_server(made["draft"], target=made["targets"]["a"], form="explicit")
    assert plan.target == str(Path(made["targets"]["a"]).resolve())


def test_a_draft_whose_verifier_is_elsewhere_is_checked_against_its_own_config(made, tmp_path):
    from engine.errors import WorkbenchError
    from engine.targets.identity import target_for_draft

    draft = Path(shutil.copytree(made["draft"], tmp_path / "draft"))
    config = json.loads((draft / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = "someone/not-cached-anywhere"
    (draft / "config.json").write_text(json.dumps(config))
    assert target_for_draft(draft, made["targets"]["a"]) == made["targets"]["a"]
    with pytest.raises(WorkbenchError, match="someone/not-cached-anywhere") as info:
        target_for_draft(draft, made["targets"]["narrow"])
    assert "width 64 vs 32" in str(info.value)
