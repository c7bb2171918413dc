"""The algorithm interface: a toy algorithm in one folder is trained, listed, saved, reloaded and drafted with,
without any other file changing; no algorithm name leaks outside its folder; the registry drives every list."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "toy_algo"


def _env() -> dict[str, str]:
    return {**os.environ, "WORKBENCH_ALGO_PLUGINS": str(TOY)}


def _engine(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(), timeout=600)


def test_toy_algorithm_trains_saves_reloads_and_drafts_losslessly(toy_registered, tiny_targets, tmp_path):
    target = str(tiny_targets["llama"])
    help_text = _engine("train", "--help").stdout
    assert "--toy-init-std" in help_text and "Toy: standard deviation" in help_text
    assert re.search(r"--algo \{[^}]*toy[^}]*\}", help_text)

    out = tmp_path / "run"
    proc = _engine("train", "--algo", "toy", "--target", target, "--online-dataset", "sharegpt",
                   "--online-max-samples", "12", "--max-steps", "4", "--tokens-per-batch", "256", "--max-length", "96",
                   "--warmup-steps", "1", "--val-fraction", "0.25", "--val-every", "2", "--toy-init-std", "0.05",
                   "--epochs", "20",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4]
    assert all("est_acceptance_length" in r for r in rows)
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "toy"
    saved = (out / "train_args.json")
    assert not saved.exists()  # nothing algorithm-specific is written by the generic trainer

    # its own speculators type is validated: vLLM's stance (not served) as a warning, its own rule as an error
    check = _engine("validate", str(out / "draft"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "OK (toy)" in check.stdout and "vLLM 0.33 does not serve 'toy' drafts" in check.stdout
    from engine.format.validate import validate_draft

    report = validate_draft({**cfg, "aux_hidden_state_layer_ids": []}, check_weights=False)
    assert [e.field for e in report.errors] == ["aux_hidden_state_layer_ids"]
    assert "toy head reads no target layer" in report.errors[0].message

    # an EAGLE-3 argument is refused for the toy, naming its owner
    bad = _engine("train", "--algo", "toy", "--target", target, "--online-dataset", "sharegpt", "--ttt-steps", "2",
                  "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0 and "argument of eagle3" in (bad.stdout + bad.stderr)

    # reload: the same weights as the checkpoint on disk
    from safetensors.torch import load_file

    draft = toy_registered.load(out / "draft")
    on_disk = load_file(str(out / "draft" / "model.safetensors"))
    assert set(on_disk) == set(draft.state_dict())
    assert all(torch.equal(on_disk[k].float(), v) for k, v in draft.state_dict().items())

    # drafting through `generate`: identical text to the target alone, and the draft's tokens were used
    args = ["--target", target, "--max-new-tokens", "24", "--events"]
    base = _engine("generate", "Tell me a story.", "--method", "baseline", *args)
    spec = _engine("generate", "Tell me a story.", "--method", "draft", "--draft", str(out / "draft"), "--k", "3",
                   *args)
    assert base.returncode == 0 and spec.returncode == 0, spec.stderr[-3000:]
    base_tokens = [t for line in base.stdout.splitlines() for t in json.loads(line)["tokens"]]
    events = [json.loads(line) for line in spec.stdout.splitlines()]
    assert [t for e in events for t in e["tokens"]] == base_tokens
    assert any(e["drafted"] for e in events), "the toy draft never proposed a token"
    assert all(e["drafted"] <= 1 for e in events)  # its largest k is 1, whatever --k says


ALGO_NAMES = re.compile(r"\b(eagle-?3|p-?eagle|dflash2?|dspark|xpress)\b", re.IGNORECASE)
# Where algorithm names belong: their own folders (each carries its speculators type and vLLM rules),
# the converters (one module per published source layout) and the recipes; not engine/format.
ALLOWED = ("engine/algos/", "engine/convert/", "configs/")


def _code_files():
    for folder in ("engine", "ui", "pages"):
        yield from (ROOT / folder).rglob("*.py")
    yield ROOT / "app.py"


def test_no_algorithm_name_outside_its_folder():
    offenders = []
    for path in _code_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if ALGO_NAMES.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "algorithm names outside engine/algos, engine/convert:\n" + "\n".join(offenders)


def test_every_page_lists_the_registry_plugins_included(toy_registered):
    """Train, Data and the Config builder offer the same algorithms, in the registry's order, the toy among them."""
    from engine.algos import algorithm_names
    from engine.data.extract.layer_ids import layer_algorithms
    from ui import builder, data, training

    names = algorithm_names()
    assert "toy" in names and names[0] == "eagle3"
    assert training.algorithm_names() == data.algorithm_names() == builder.algorithms() == layer_algorithms() == names


def test_the_toys_type_is_registered_and_builds_a_fresh_config(toy_registered, tiny_targets):
    from engine.format.config import build_draft_config, config_types, parse_draft_config

    assert "toy" in config_types()
    cfg = build_draft_config("toy", verifier_config={"hidden_size": 8, "num_attention_heads": 1,
                                                     "intermediate_size": 8, "vocab_size": 16},
                             verifier_name="x/y", layer_config={"hidden_size": 8, "vocab_size": 16},
                             aux_hidden_state_layer_ids=[1], draft_vocab_size=16)
    assert cfg.speculative_tokens == 1  # the toy type's own default k
    assert type(parse_draft_config(cfg.to_dict())) is toy_registered.config_class


def test_listing_algorithms_imports_no_torch():
    code = ("import sys; import engine.algos, engine.train.config, engine.commands.train, "
            "engine.data.extract.layer_ids; print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.strip() == "False", proc.stderr


def test_algorithm_arguments_never_shadow_common_fields():
    from engine.algos import ALGOS
    from engine.train.config import TrainConfig

    for name in ALGOS.names():
        clash = set(ALGOS.get(name).args_class.model_fields) & set(TrainConfig.model_fields)
        assert not clash, f"{name} arguments {clash} have the names of common training fields"


def test_flat_and_nested_algorithm_arguments_are_the_same_config():
    from engine.train.config import TrainConfig

    flat = TrainConfig(data="x", ttt_steps=4, draft_vocab_size=64)
    nested = TrainConfig(data="x", algo_args={"ttt_steps": 4, "draft_vocab_size": 64})
    assert flat == nested and flat.algo_args.ttt_steps == 4
    assert TrainConfig.model_validate(flat.model_dump()) == flat  # what checkpoints and config.yaml store
    mixed = TrainConfig(data="x", algo_args={"ttt_steps": 4}, ttt_steps=5)  # a flag overrides the YAML's block
    assert mixed.algo_args.ttt_steps == 5
    with pytest.raises(ValueError, match="ttt_steps"):
        TrainConfig(data="x", ttt_steps=0)
    with pytest.raises(ValueError, match="unknown algorithm 'medusa'"):
        TrainConfig(data="x", algo="medusa")


def test_format_types_we_only_validate_get_a_clear_error(tmp_path):
    """A speculators type registered without an algorithm (validated, not drafted; every built-in type now has one)
    is refused by name when a draft of it is to be run."""
    from typing import ClassVar, Literal

    from engine.algos.loading import draft_algorithm
    from engine.errors import WorkbenchError
    from engine.format.config import CONFIG_TYPES, DraftConfig, register_config_type

    @register_config_type
    class OnlyValidated(DraftConfig):
        algorithm: ClassVar[str] = "only_validated"
        speculators_model_type: Literal["only_validated"] = "only_validated"

    try:
        (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "only_validated"}))
        with pytest.raises(WorkbenchError, match="cannot train or draft 'only_validated'"):
            draft_algorithm(tmp_path)
    finally:
        CONFIG_TYPES.unregister("only_validated")


def test_a_flag_several_algorithms_share_shows_each_ones_default():
    from engine.algos import ALGOS
    from engine.commands.train import shared_defaults

    shared = shared_defaults()
    for field, text in shared.items():
        owners = [n for n in ALGOS.names() if field in ALGOS.get(n).args_class.model_fields]
        assert len(owners) > 1 and all(f"{n} " in text for n in owners), (field, text)
    differing = {f for f in {f for n in ALGOS.names() for f in ALGOS.get(n).args_class.model_fields}
                 if len({repr(ALGOS.get(n).args_class.model_fields[f].default) for n in ALGOS.names()
                         if f in ALGOS.get(n).args_class.model_fields}) > 1}
    assert set(shared) == differing and "num_layers" in shared
