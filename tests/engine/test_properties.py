"""Property-based tests (issue 18): any input to the config reader/validator, the safetensors reader and the
dataset readers yields a valid object or our error type (WorkbenchError), never another exception, and leaves
no partial file behind. Example counts and deadlines are small so the default suite stays fast."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.errors import WorkbenchError  # noqa: E402

FAST = settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)

GOOD_CONFIG = {
    "speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"], "draft_vocab_size": 64,
    "norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
    "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                           "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                           "verifier": {"name_or_path": "org/tiny", "architectures": ["LlamaForCausalLM"]}},
    "transformer_layer_config": {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64,
                                 "num_hidden_layers": 1, "head_dim": 8, "rms_norm_eps": 1e-5},
}


def _paths(d: dict, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


CONFIG_PATHS = list(_paths(GOOD_CONFIG))


def _mutated(path, value):
    cfg = json.loads(json.dumps(GOOD_CONFIG))
    node = cfg
    for k in path[:-1]:
        node = node[k]
    if value is _DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return cfg


_DELETE = object()


def _only_our_errors(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except WorkbenchError:
        return None


@FAST
@given(st.sampled_from(CONFIG_PATHS), json_values | st.just(_DELETE))
def test_the_validator_reports_any_config_change_as_findings(path, value):
    from engine.format.validate import validate_draft

    report = validate_draft(_mutated(path, value), verifier_config={"hidden_size": 32, "vocab_size": 64,
                                                                    "num_hidden_layers": 4})
    assert isinstance(report.ok, bool)
    for issue in report.errors + report.warnings:
        assert isinstance(issue.field, str) and issue.field and isinstance(issue.message, str)
    json.dumps(report.to_json(), default=str)  # the CLI's --json works on it


@FAST
@given(json_values)
def test_the_validator_survives_any_json_document(doc):
    from engine.format.validate import validate_draft

    if isinstance(doc, dict):
        validate_draft(doc)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(doc))
        report = validate_draft(tmp)  # a config file that is not an object: one finding, no exception
        assert isinstance(report.ok, bool)


@FAST
@given(st.binary(max_size=200))
def test_the_config_reader_gives_a_dict_or_our_error_for_any_bytes(data):
    from engine.format.checkpoint import read_config_dict
    from engine.format.validate import validate_draft

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_bytes(data)
        cfg = _only_our_errors(read_config_dict, tmp)
        assert cfg is None or isinstance(cfg, dict)
        assert isinstance(validate_draft(tmp).ok, bool)
        assert os.listdir(tmp) == ["config.json"]  # nothing written next to it


def _safetensors_bytes(header: object, payload: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


headers = st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "BF16", "I64", "BOOL", "F8", "X"]),
                           "shape": st.lists(st.integers(-1, 5), max_size=3),
                           "data_offsets": st.lists(st.integers(-2, 64), min_size=0, max_size=3)}),
    max_size=3)


@FAST
@given(st.one_of(st.binary(max_size=128), st.builds(_safetensors_bytes, headers, st.binary(max_size=64))))
def test_the_safetensors_reader_gives_tensors_or_our_error(data):
    from engine.format.checkpoint import load_state_dict, tensor_index
    from engine.format.validate import validate_draft

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(GOOD_CONFIG))
        (folder / "model.safetensors").write_bytes(data)
        index = _only_our_errors(tensor_index, folder)
        assert index is None or isinstance(index, dict)
        report = validate_draft(folder)
        assert index is not None or not report.ok
        try:
            load_state_dict(folder)
        except WorkbenchError:
            pass
        except Exception as exc:  # noqa: BLE001 - safetensors' own errors are translated for the user
            from engine.errors import translate

            assert translate(exc) is not None, repr(exc)
        assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]


rows = st.one_of(json_values, st.fixed_dictionaries({"messages": json_values}),
                 st.fixed_dictionaries({"conversations": json_values}),
                 st.fixed_dictionaries({"prompt": json_values, "completion": json_values}),
                 st.fixed_dictionaries({"input_ids": json_values, "loss_mask": json_values}))


@FAST
@given(st.lists(rows, max_size=5), st.booleans())
def test_the_dataset_readers_give_rows_or_skips_for_any_records(records, prompt_only):
    from engine.data.render.datasets import load_conversations

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (("d.jsonl", "".join(json.dumps(r) + "\n" for r in records)),
                           ("d.json", json.dumps(records))):
            path = Path(tmp) / name
            path.write_text(text)
            loaded = _only_our_errors(load_conversations, str(path), split="all", prompt_only=prompt_only)
            assert loaded is not None  # a list of records is never refused as a whole
            kept, summary = loaded
            assert summary.rows_read == len(records) and summary.rows_kept == len(kept)
            assert summary.rows_kept + sum(summary.skipped.values()) == len(records)
            for row in kept:
                assert isinstance(row["id"], str)
                assert all(isinstance(m["content"], str) and m["role"] in ("system", "user", "assistant")
                           for m in row.get("messages", []))


@FAST
@given(st.binary(max_size=300), st.sampled_from(["d.jsonl", "d.json"]))
def test_the_dataset_readers_survive_any_bytes(data, name):
    from engine.data.render.datasets import load_conversations

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        loaded = _only_our_errors(load_conversations, str(path), split="all")
        if loaded is not None:
            kept, summary = loaded
            assert summary.rows_kept == len(kept)
        assert os.listdir(tmp) == [name]
