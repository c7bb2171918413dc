"""The Convert page on tiny checkpoints in the new source layouts (tests/convert_layouts.py): detected format and
mapping table, the format choice from the converter registry, a dry run that writes nothing, refusals as messages."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from convert_layouts import dspark_deepspec, peagle_specforge, write_checkpoint


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setenv("WORKBENCH_RUNS", str(root))
    return root


def _open(tiny_targets, path: str):
    from testkit.app import ok, open_app

    at = open_app(str(tiny_targets["llama"]), page="convert")
    at.text_input(key="convert_path").set_value(path).run()
    ok(at)
    return at


def _all_text(at) -> str:
    from testkit.app import texts

    return "\n".join(texts(getattr(at, kind)) for kind in ("markdown", "error", "info", "success", "caption", "code"))


def test_detected_layout_mapping_and_the_registry_as_format_choice(runs, tiny_targets, tmp_path):
    from engine.convert import CONVERTERS
    from testkit.app import ok, texts
    from ui.convert import format_title

    src = peagle_specforge(tmp_path / "peagle")
    at = _open(tiny_targets, str(src))
    assert "P-EAGLE SpecForge checkpoint" in texts(at.markdown)
    choice = at.selectbox(key="convert_format")
    assert choice.value == "peagle-specforge"
    assert choice.options == [format_title(n) for n in CONVERTERS.names()]  # the registry, in its order
    for name in ("peagle-specforge", "peagle-aws", "dspark-deepspec"):
        assert format_title(name) in choice.options
    mapping = at.dataframe[0].value
    row = mapping[mapping["source key"] == "mask_hidden"].iloc[0]
    assert row["speculators key"] == "mask_hidden" and row["shape"] == "[1, 1, 192]"
    assert "peagle_config.json" in texts(at.markdown)  # the converter's notes
    assert at.text_input(key="convert_mask") is not None  # P-EAGLE reads a mask token option
    # read as another registered layout: its table (nothing of DeepSpec's maps), the CLI gets --format
    choice.set_value("dspark-deepspec").run()
    ok(at)
    mapping = at.dataframe[0].value
    assert (mapping[mapping["source key"] == "mask_hidden"]["note"] == "NOT MAPPED: the conversion will refuse").all()
    assert "read as your choice; detected: peagle-specforge" in texts(at.caption)
    assert "--format dspark-deepspec" in texts(at.code)


def test_dry_run_writes_nothing_and_a_missing_mask_token_is_asked_for(runs, tiny_targets, tmp_path):
    from testkit.app import ok, texts

    src = peagle_specforge(tmp_path / "peagle")
    (src / "peagle_config.json").unlink()  # the mask token is then recorded nowhere
    before = sorted(p.name for p in src.iterdir())
    at = _open(tiny_targets, str(src))
    at.text_input(key="convert_verifier").set_value(str(tiny_targets["llama"]))
    at.text_input(key="convert_aux").set_value("1, 2, 3")
    at.button(key="convert_dry").click().run()
    ok(at)
    assert "Dry run failed:" in texts(at.error) and "records no mask token" in texts(at.error)
    assert "What to do:** give --mask-token-id" in texts(at.info)
    at.text_input(key="convert_mask").set_value("383")
    at.button(key="convert_dry").click().run()
    ok(at)
    assert "Every tensor maps" in texts(at.success)
    shown = at.json[-1].value
    config = json.loads(shown) if isinstance(shown, str) else shown
    assert config["speculators_model_type"] == "peagle" and config["mask_token_id"] == 383
    assert "--mask-token-id 383" in texts(at.code)
    assert sorted(p.name for p in src.iterdir()) == before  # nothing written beside the source
    assert not (runs / "converted").exists()  # nor where the conversion would go
    assert "Traceback" not in _all_text(at)


def test_a_refusal_is_a_clear_message_not_a_traceback(runs, tiny_targets, tmp_path):
    from testkit.app import ok, texts

    good = dspark_deepspec(tmp_path / "good")
    state = load_file(str(good / "model.safetensors"))
    bad = write_checkpoint(tmp_path / "dspark", json.loads((good / "config.json").read_text()),
                           {**state, "fusion_bias": torch.ones(8)})
    at = _open(tiny_targets, str(bad))
    assert "DSpark DeepSpec checkpoint" in texts(at.markdown)
    mapping = at.dataframe[0].value
    assert mapping[mapping["source key"] == "fusion_bias"].iloc[0]["note"] == "NOT MAPPED: the conversion will refuse"
    at.button(key="convert_dry").click().run()
    ok(at)
    assert "fusion_bias [8]: no rule of this source maps it" in texts(at.error)
    assert not texts(at.success) or "Every tensor maps" not in texts(at.success)
    assert not at.exception and "Traceback" not in _all_text(at)
