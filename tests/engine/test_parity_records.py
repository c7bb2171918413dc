"""Training–serving parity of the shipped drafts, read from the records their recipes kept (issue 65), and a broken
record named as a mismatch."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.algos.shipped import ASSETS
from engine.measure.parity import DIFFERS, SAME, kept_records, parity

BUILTIN = "smollm2-135m-instruct"


def _factors(result) -> dict[str, dict]:
    return {f["factor"]: f for f in result["findings"]}


@pytest.mark.parametrize("name", ["eagle3", "dflash", "dflash2"])
def test_a_shipped_draft_shows_what_its_recipe_recorded(name):
    draft = ASSETS / f"smollm2-135m-instruct-{name}"
    result = parity(draft, target=BUILTIN, dtype="bfloat16", max_model_len=2048)
    found = _factors(result)
    assert result["kept"] and result["run"] == str(kept_records(draft))
    assert "Q4_1 GGUF" in found["target weights"]["trained"] and found["target weights"]["verdict"] == SAME
    assert found["aux layer ids (vLLM numbering)"]["verdict"] == SAME
    assert found["hidden-state dtype"]["trained"] == "bf16" and found["hidden states computed by"]["trained"] == "vllm"
    assert "greedy" in found["training answers"]["trained"] and found["training answers"]["verdict"] == SAME
    # trained on 768 tokens, served up to 2,048: flagged, with what it does
    assert found["context length"]["trained"] == "up to 768 tokens" and found["context length"]["verdict"] == DIFFERS
    assert found["context length"]["effect"]


def test_a_broken_record_is_named(tmp_path):
    """A copy of the shipped draft whose config names other layers, and a copy of its records whose hidden states
    were float32: each factor is named as a difference."""
    draft = shutil.copytree(ASSETS / "smollm2-135m-instruct-eagle3", tmp_path / "draft")
    config = json.loads((draft / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [2, 15, 26]
    (draft / "config.json").write_text(json.dumps(config))
    found = _factors(parity(draft, target=BUILTIN))  # the same weights: found by their digest
    assert found["aux layer ids (vLLM numbering)"]["verdict"] == DIFFERS
    assert "other layers" in found["aux layer ids (vLLM numbering)"]["effect"]
    records = shutil.copytree(kept_records(draft), tmp_path / "records")
    manifest = json.loads((records / "hidden-manifest.json").read_text())
    (records / "hidden-manifest.json").write_text(json.dumps({**manifest, "dtype": "fp32"}))
    found = _factors(parity(draft, run=records, target=BUILTIN))
    assert found["hidden-state dtype"]["verdict"] == DIFFERS and found["hidden-state dtype"]["trained"] == "fp32"


def test_other_weights_find_no_kept_records(tmp_path):
    draft = shutil.copytree(ASSETS / "smollm2-135m-instruct-dflash", tmp_path / "draft")
    shard = next(draft.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes() + b" ")  # not the bytes any recipe measured
    assert kept_records(draft) is None
