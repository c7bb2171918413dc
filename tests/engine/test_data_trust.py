"""Training data you can trust: a changed target, bad numbers in configs, bad hidden-state files and non-finite
steps end in clear errors (or, when asked, skipped and counted), and nothing a user wrote is changed."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from testkit.cli import run_cli
from tiny import save_tiny_target

TRAIN = ("--max-steps", "2", "--tokens-per-batch", "256", "--warmup-steps", "1", "--val-fraction", "0.25",
         "--num-layers", "1")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny Llama target and 8 samples extracted from it (fp32)."""
    from engine.cli import main

    root = tmp_path_factory.mktemp("trust")
    target = save_tiny_target(root / "target", "llama")
    data = root / "hs"
    assert main(["extract", "--target", str(target), "--dataset", "sharegpt", "--max-samples", "8",
                 "--max-length", "64", "--dtype", "fp32", "--out", str(data), "--verify"]) == 0  # verify passes
    return {"root": root, "target": target, "data": data}


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _own_copies(made, tmp_path: Path) -> tuple[Path, Path, dict]:
    """A copy of the target and of its data whose manifest points at that copy (to be changed in place)."""
    target = _copy(made["target"], tmp_path / "target")
    data = _copy(made["data"], tmp_path / "hs")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["target_path"] = str(target.resolve())
    (data / "manifest.json").write_text(json.dumps(manifest))
    return target, data, manifest


def _rewrite_sample(path: Path, change) -> None:
    """Rewrite one hs_i file with `change` applied to its tensors (the recorded digest is kept as it was)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata=metadata)


# -- 1. data that no longer matches its target ------------------------------------------------------------------


def test_the_manifest_records_the_digest_of_the_targets_tensors(made, tmp_path):
    from engine.targets.identity import target_digest

    manifest = json.loads((made["data"] / "manifest.json").read_text())
    assert manifest["target_digest"] == target_digest(made["target"])
    # the digest is of the tensors, not the files: the same tensors in two shards under other names agree
    state = load_file(str(made["target"] / "model.safetensors"))
    names = sorted(state)
    resharded = _copy(made["target"], tmp_path / "resharded")
    (resharded / "model.safetensors").unlink()
    save_file({k: state[k] for k in names[::2]}, str(resharded / "part-a.safetensors"))
    save_file({k: state[k] for k in names[1::2]}, str(resharded / "part-b.safetensors"), metadata={"x": "y"})
    assert target_digest(resharded) == manifest["target_digest"]


def test_train_refuses_data_whose_target_changed_in_place_and_a_flag_accepts_it(made, tmp_path, capsys):
    from engine.targets.identity import target_digest

    target, data, manifest = _own_copies(made, tmp_path)
    state = load_file(str(target / "model.safetensors"))
    name = next(k for k in sorted(state) if "layers.1.mlp.down_proj" in k)
    state[name] = state[name] * 0.5  # same shapes, other values, in place
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    before = _snapshot(data)
    rc, _, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--out", str(tmp_path / "run"))
    assert rc == 2, err
    assert "are not those the data was made from" in err
    assert manifest["target_digest"] in err and target_digest(target) in err
    assert "--accept-target-change" in err
    assert not (tmp_path / "run" / "draft").exists()
    rc, out, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--accept-target-change",
                           "--out", str(tmp_path / "run2"))
    assert rc == 0, err
    assert _snapshot(data) == before  # nothing of the user's was changed


def test_a_draft_records_its_targets_digest_and_decoding_beside_changed_weights_is_refused(made, tmp_path, capsys):
    from engine.errors import WorkbenchError
    from engine.serve.server import plan_server
    from engine.targets.identity import target_digest

    target, data, manifest = _own_copies(made, tmp_path)
    rc, _, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--out", str(tmp_path / "run"))
    assert rc == 0, err
    draft = tmp_path / "run" / "draft"
    verifier = json.loads((draft / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["tensors_digest"] == manifest["target_digest"]
    argv = ("generate", "Hello", "--method", "draft", "--draft", str(draft), "--max-new-tokens", "4",
            "--dtype", "fp32")
    assert run_cli(capsys, *argv)[0] == 0
    state = load_file(str(target / "model.safetensors"))
    state["lm_head.weight"] = state["lm_head.weight"].flip(0)  # same shape, other values
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and "are not those the draft was made from" in err and target_digest(target) in err, err
    with pytest.raises(WorkbenchError, match="are not those the draft was made from"):
        plan_server(draft, target=str(target), form="explicit")
    rc, _, err = run_cli(capsys, *argv, "--accept-target-change")
    assert rc == 0, err


# -- 2. non-finite and out-of-range numbers in configs ----------------------------------------------------------


@pytest.mark.parametrize("field, value, fragment", [
    ("rms_norm_eps", float("nan"), "is nan (not a finite number)"),
    ("rope_theta", float("inf"), "is inf (not a finite number)"),
    ("rms_norm_eps", -1e-6, "must be greater than 0"),
])
def test_validate_refuses_non_finite_and_out_of_range_numbers(field, value, fragment, tmp_path):
    from engine.format.validate import validate_draft

    draft = _copy(Path("assets/drafts/smollm2-135m-instruct-dflash"), tmp_path / "d")
    config = json.loads((draft / "config.json").read_text())
    config["transformer_layer_config"][field] = value
    (draft / "config.json").write_text(json.dumps(config))  # json writes NaN/Infinity, as a careless tool would
    for report in (validate_draft(draft), validate_draft(config)):  # a folder; a dict, as the Config builder checks
        hits = [e for e in report.errors if e.field == f"transformer_layer_config.{field}"]
        assert not report.ok and hits and fragment in hits[0].message, [(e.field, e.message) for e in report.errors]


def test_a_recipe_and_a_train_config_with_nan_are_refused(tmp_path, capsys):
    from engine.errors import WorkbenchError
    from engine.recipes.spec import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: .nan\n")
    with pytest.raises(WorkbenchError, match=r"`train.lr` is nan"):
        load_recipe(str(recipe))
    rc, _, err = run_cli(capsys, "train", "--config", str(recipe), "--data", "x")
    assert rc == 2 and "lr" in err and "finite" in err, err


def test_convert_refuses_a_source_config_with_nan_before_writing(tmp_path, capsys):
    import convert_layouts

    src = convert_layouts.specforge(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["rms_norm_eps"] = float("nan")
    (src / "config.json").write_text(json.dumps(config))
    rc, _, err = run_cli(capsys, "convert", str(src), "--out", str(tmp_path / "out"))
    assert rc == 2 and "`rms_norm_eps` is nan" in err and str(src / "config.json") in err, err
    assert not (tmp_path / "out").exists()


# -- 3. and 4. bad hidden-state files ----------------------------------------------------------------------------


def test_token_ids_outside_the_vocabulary_are_named_or_skipped(made, tmp_path, capsys):
    data = _copy(made["data"], tmp_path / "hs")
    bad = data / "hs_3.safetensors"
    _rewrite_sample(bad, lambda t: t["token_ids"].__setitem__(5, 100_000))
    before = _snapshot(data)
    rc, _, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--out", str(tmp_path / "run"))
    assert rc == 2, err
    assert str(bad) in err and "token id 100000 at position 5" in err and "vocabulary of 384 tokens" in err
    assert "unexpected" not in err and not (tmp_path / "run" / "draft").exists()
    rc, _, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--bad-samples", "skip",
                         "--out", str(tmp_path / "run2"))
    assert rc == 0, err
    report = json.loads((tmp_path / "run2" / "data_check.json").read_text())
    tokens = int(load_file(str(bad))["token_ids"].numel())
    assert report["skipped_files"][0]["file"] == str(bad) and report["skipped_tokens"] == tokens
    assert _snapshot(data) == before


def test_nan_hidden_states_are_refused_or_skipped_and_never_reach_the_draft(made, tmp_path, capsys):
    data = _copy(made["data"], tmp_path / "hs")
    bad = data / "hs_2.safetensors"
    _rewrite_sample(bad, lambda t: t["hidden_states"].__setitem__((4, 1, 7), float("nan")))
    rc, _, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--out", str(tmp_path / "run"))
    assert rc == 2, err
    assert str(bad) in err and "non-finite" in err and "position 4, layer column 1" in err
    assert not (tmp_path / "run" / "draft").exists()
    rc, _, err = run_cli(capsys, "train", "--data", str(data), *TRAIN, "--bad-samples", "skip",
                         "--out", str(tmp_path / "run2"))
    assert rc == 0, err
    weights = load_file(str(tmp_path / "run2" / "draft" / "model.safetensors"))
    assert all(bool(torch.isfinite(w.float()).all()) for w in weights.values())
    assert json.loads((tmp_path / "run2" / "data_check.json").read_text())["skipped_files"][0]["file"] == str(bad)


def test_check_names_every_bad_file_and_extract_verify_passes_a_good_folder(made, tmp_path, capsys):
    data = _copy(made["data"], tmp_path / "hs")
    rc, out, err = run_cli(capsys, "check", str(data), "--full")
    assert rc == 0 and "8 files" in out, err
    _rewrite_sample(data / "hs_1.safetensors", lambda t: t["hidden_states"].mul_(1.001))  # finite, changed
    (data / "hs_6.safetensors").write_bytes((data / "hs_6.safetensors").read_bytes()[:300])  # truncated
    rc, _, err = run_cli(capsys, "check", str(data))
    assert rc == 2 and "hs_6" in err and "hs_1" not in err, err  # the quick check reads no hidden state
    rc, out, err = run_cli(capsys, "check", str(data), "--full", "--json")
    assert rc == 2, err
    bad = {Path(b["file"]).name: b["problem"] for b in json.loads(out)["bad"]}
    assert set(bad) == {"hs_1.safetensors", "hs_6.safetensors"}, bad
    assert "digest" in bad["hs_1.safetensors"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_full_check_never_passes_a_corrupted_file_whose_tensors_changed(made, tmp_path_factory, data):
    """Random corruptions (byte flips anywhere, truncation, appended bytes): the full check names the file, or the
    tensors read from it are exactly the original ones (only metadata or padding changed)."""
    from engine.data.store.check import Expected, full_check

    src = made["data"] / "hs_0.safetensors"
    raw = bytearray(src.read_bytes())
    kind = data.draw(st.sampled_from(["flip", "flip", "truncate", "append"]))
    if kind == "flip":
        for offset in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=4)):
            raw[offset] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        raw += bytes(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=64)))
    path = tmp_path_factory.mktemp("corrupt") / "hs_0.safetensors"
    path.write_bytes(bytes(raw))
    manifest = json.loads((made["data"] / "manifest.json").read_text())
    problem = full_check(path, Expected.from_manifest(manifest))
    if problem is None:
        original, now = load_file(str(src)), load_file(str(path))
        assert set(original) == set(now) and all(torch.equal(original[k], now[k]) for k in original), kind
    else:
        assert problem.path == path and problem.what


# -- 4. non-finite steps -----------------------------------------------------------------------------------------


def _trainer(made, out: Path, **over):
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer

    fields = dict(data=str(made["data"]), out=str(out), max_steps=6, epochs=10, tokens_per_batch=256, warmup_steps=1,
                  val_fraction=0.25, checkpoint_every=1, keep_checkpoints=10, val_every=100,
                  algo_args={"num_layers": 1})
    cfg = TrainConfig(**{**fields, **over})
    return Trainer(cfg)


def _nan_from(trainer, first_bad_step: int, last_bad_step: int = 10**9):
    """Make the objective's loss NaN on the optimizer steps first_bad_step..last_bad_step (1-based)."""
    objective = trainer.objective

    class Poisoned:
        def __getattr__(self, name):
            return getattr(objective, name)

        def __call__(self, model, batch):
            loss, stats = objective(model, batch)
            if model.training and first_bad_step <= trainer.step + 1 <= last_bad_step:
                loss = loss * float("nan")
            return loss, stats

    trainer.objective = Poisoned()


def test_non_finite_steps_in_a_row_stop_the_run_with_the_last_good_checkpoint_kept(made, tmp_path):
    from engine.errors import WorkbenchError

    trainer = _trainer(made, tmp_path / "run", max_nonfinite_steps=3)
    _nan_from(trainer, 3)
    with pytest.raises(WorkbenchError) as info:
        trainer.run()
    message = str(info.value)
    assert "3 steps in a row had a non-finite loss" in message and "hs_" in message
    assert not (tmp_path / "run" / "draft").exists()
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert kept[-1] == "step_0000004" and kept[-1] in message  # the last checkpoint, named in the message
    # skipped steps leave the weights as they were: that checkpoint holds step 2's weights, finite
    assert load_file(str(tmp_path / "run" / "checkpoints" / kept[-1] / "model.safetensors")).keys()
    weights = load_file(str(tmp_path / "run" / "checkpoints" / kept[-1] / "model.safetensors"))
    assert all(bool(torch.isfinite(w.float()).all()) for w in weights.values())
    skipped = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
               if json.loads(x)["split"] == "skipped"]
    assert [r["step"] for r in skipped] == [3, 4, 5] and all(r["files"] for r in skipped)


def test_an_isolated_non_finite_step_is_skipped_counted_and_the_run_finishes(made, tmp_path):
    trainer = _trainer(made, tmp_path / "run")
    _nan_from(trainer, 2, 2)
    final = trainer.run()
    report = json.loads((tmp_path / "run" / "data_check.json").read_text())
    assert report["nonfinite_steps"] == 1
    weights = load_file(str(final / "model.safetensors"))
    assert all(bool(torch.isfinite(w.float()).all()) for w in weights.values())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows if r["split"] == "train")


def test_weights_that_became_non_finite_are_never_written(made, tmp_path):
    from engine.errors import WorkbenchError

    trainer = _trainer(made, tmp_path / "run", max_steps=2)
    step = trainer.opt.step

    def overflow():
        step()
        with torch.no_grad():
            next(p for p in trainer.draft.parameters() if p.requires_grad).fill_(float("inf"))

    trainer.opt.step = overflow
    with pytest.raises(WorkbenchError, match="non-finite values at step 1"):
        trainer.run()
    assert not (tmp_path / "run" / "draft").exists()
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))
