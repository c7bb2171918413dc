"""Datasets: shape detection, role mapping, bad-row accounting, the hashed split, held-out prompts, ShareGPT."""

from __future__ import annotations

import json
import logging

import pytest

from engine.data.render import sources
from engine.data.render.datasets import detect_shape, heldout_prompts, load_conversations, split_of
from engine.errors import WorkbenchError

CHAT = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]


def _jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_openai_messages_shape(tmp_path):
    system = [{"role": "system", "content": "S"}]
    f = _jsonl(tmp_path / "m.jsonl", [{"id": "a", "messages": CHAT}, {"messages": system + CHAT}])
    rows, summary = load_conversations(str(f), split="all")
    assert summary.shape == "messages" and summary.rows_kept == 2 and not summary.skipped
    assert rows[0] == {"id": "a", "messages": CHAT}
    assert rows[1]["id"] == "row-1" and rows[1]["messages"][0]["role"] == "system"


def test_sharegpt_conversations_shape_maps_roles(tmp_path):
    conv = [{"from": "system", "value": "S"}, {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
            {"from": "user", "value": "q2"}, {"from": "chatgpt", "value": "a2"}, {"from": "human", "value": "q3"},
            {"from": "bing", "value": "a3"}, {"from": "human", "value": "q4"}, {"from": "bard", "value": "a4"}]
    f = _jsonl(tmp_path / "c.jsonl", [{"id": "x", "conversations": conv}])
    rows, summary = load_conversations(str(f), split="all")
    assert summary.shape == "conversations"
    assert [m["role"] for m in rows[0]["messages"]] == ["system"] + ["user", "assistant"] * 4
    assert [m["content"] for m in rows[0]["messages"]][1:3] == ["q1", "a1"]


def test_prompt_completion_shape(tmp_path):
    f = _jsonl(tmp_path / "p.jsonl", [{"prompt": "2+2?", "completion": "4"},
                                       {"prompt": [{"role": "user", "content": "u"}],
                                        "completion": [{"role": "assistant", "content": "a"}]}])
    rows, summary = load_conversations(str(f), split="all")
    assert summary.shape == "prompt_completion"
    assert rows[0]["messages"] == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert rows[1]["messages"][1] == {"role": "assistant", "content": "a"}


def test_tokenised_shape_passes_through_and_bad_lengths_are_counted(tmp_path):
    f = _jsonl(tmp_path / "t.jsonl", [{"id": "t0", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
                                       {"input_ids": [5, 6], "loss_mask": [1]}])
    rows, summary = load_conversations(str(f), split="all")
    assert summary.shape == "tokenised"
    assert rows == [{"id": "t0", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}]
    assert summary.skipped == {"input_ids/loss_mask length mismatch": 1}


def test_bad_rows_are_skipped_counted_and_reported(tmp_path):
    f = _jsonl(tmp_path / "bad.jsonl", [
        {"messages": CHAT},
        {"text": "no known shape"}, {"foo": 1}, "[1, 2]",                     # 3 unknown shape
        {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]},  # empty turn
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "  "}]},    # empty turn
        {"messages": [{"role": "tool", "content": "x"}]},                     # unknown role
        {"messages": [{"role": "user", "content": "only a question"}]},       # no assistant turn
        "{not json",                                                          # invalid line
    ])
    rows, summary = load_conversations(str(f), split="all")
    assert len(rows) == 1
    assert summary.skipped == {"unknown shape": 3, "empty turn": 2, "unknown role 'tool'": 1,
                               "no assistant turn": 1, "invalid JSON line": 1}
    assert "unknown shape" in summary.format() and summary.to_json()["skipped"]["empty turn"] == 2


def test_leading_assistant_turns_are_dropped(tmp_path):
    conv = [{"from": "gpt", "value": "orphan answer"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    rows, summary = load_conversations(str(_jsonl(tmp_path / "l.jsonl", [{"conversations": conv}])), split="all")
    assert [m["content"] for m in rows[0]["messages"]] == ["q", "a"]
    assert summary.adjusted["leading assistant turns dropped"] == 1


def test_json_array_and_truncated_json(tmp_path, caplog):
    full = [{"id": str(i), "messages": CHAT} for i in range(5)]
    (tmp_path / "a.json").write_text(json.dumps(full))
    rows, summary = load_conversations(str(tmp_path / "a.json"), split="all")
    assert len(rows) == 5 and not summary.truncated_source
    (tmp_path / "cut.json").write_text(json.dumps(full)[:-30])
    with caplog.at_level(logging.WARNING):
        rows, summary = load_conversations(str(tmp_path / "cut.json"), split="all")
    assert len(rows) == 4 and summary.truncated_source
    assert "truncated" in caplog.text


@pytest.mark.parametrize("use_datasets", [True, False])
def test_hf_save_to_disk_folder_with_datasets_or_pyarrow(tmp_path, use_datasets, monkeypatch):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "hf"
    datasets.Dataset.from_list([{"id": f"r{i}", "messages": CHAT} for i in range(3)]).save_to_disk(str(folder))
    real = sources.read_hf_folder
    monkeypatch.setattr(sources, "read_hf_folder", lambda p: real(p, use_datasets=use_datasets))
    rows, summary = load_conversations(str(folder), split="all")
    assert [r["id"] for r in rows] == ["r0", "r1", "r2"] and rows[0]["messages"] == CHAT
    dd = tmp_path / "hfdict"
    train = datasets.Dataset.from_list([{"prompt": "p", "completion": "c"}])
    datasets.DatasetDict({"train": train}).save_to_disk(str(dd))
    rows, summary = load_conversations(str(dd), split="all")
    assert summary.shape == "prompt_completion" and len(rows) == 1


def test_hf_folder_without_readers_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "state.json").write_text("{}")
    monkeypatch.setattr(sources, "_importable", lambda m: False)
    with pytest.raises(WorkbenchError, match="needs `datasets` or `pyarrow`"):
        load_conversations(str(tmp_path), split="all")


def test_unknown_path_is_a_clear_error():
    with pytest.raises(WorkbenchError, match="neither a built-in"):
        load_conversations("/no/such/file.jsonl")


def test_split_is_deterministic_and_independent_of_max_samples(tmp_path):
    f = _jsonl(tmp_path / "s.jsonl", [{"id": f"c{i}", "messages": CHAT} for i in range(400)])
    all_rows, _ = load_conversations(str(f), split="all")
    train, s_train = load_conversations(str(f), split="train", val_fraction=0.1)
    val, _ = load_conversations(str(f), split="val", val_fraction=0.1)
    assert {r["id"] for r in train} | {r["id"] for r in val} == {r["id"] for r in all_rows}
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert 15 <= len(val) <= 70  # about 10%
    few, _ = load_conversations(str(f), split="val", val_fraction=0.1, max_samples=5)
    assert [r["id"] for r in few] == [r["id"] for r in val[:5]]
    assert all(split_of(r["id"], 0.1, 0) == "val" for r in val)
    other_seed, _ = load_conversations(str(f), split="val", val_fraction=0.1, seed=1)
    assert {r["id"] for r in other_seed} != {r["id"] for r in val}


def test_detect_shape():
    assert detect_shape({"input_ids": [1], "loss_mask": [1], "messages": []}) == "tokenised"
    assert detect_shape({"messages": []}) == "messages"
    assert detect_shape({"conversations": []}) == "conversations"
    assert detect_shape({"prompt": "a", "completion": "b"}) == "prompt_completion"
    assert detect_shape({"text": "x"}) is None and detect_shape([1]) is None


def test_builtin_sharegpt_is_parsed_with_truncation_reported_once(caplog):
    sources._warned_truncated.clear()
    with caplog.at_level(logging.WARNING, logger="engine.data.render.sources"):
        rows, summary = load_conversations("sharegpt", split="all")
        load_conversations("sharegpt", split="all")
    assert summary.rows_read == 17671 and summary.truncated_source
    assert caplog.text.count("truncated") == 1
    assert summary.shape == "conversations" and len(rows) > 17000
    assert len({r["id"] for r in rows}) == len(rows)  # duplicate source ids made unique
    roles = {m["role"] for r in rows for m in r["messages"]}
    assert roles == {"system", "user", "assistant"}
    assert all(r["messages"][0]["role"] in ("system", "user") for r in rows)


def test_heldout_prompts_are_val_only_fixed_and_never_in_train():
    prompts = heldout_prompts("sharegpt", n=20, seed=0)
    assert len(prompts) == 20 and prompts == heldout_prompts("sharegpt", n=20, seed=0)
    assert all(p[-1]["role"] == "user" and all(m["role"] in ("system", "user") for m in p) for p in prompts)
    train, summary = load_conversations("sharegpt")  # the default split is train
    assert summary.split == "train"
    train_firsts = {r["messages"][[m["role"] for m in r["messages"]].index("user")]["content"] for r in train}
    val, _ = load_conversations("sharegpt", split="val")
    base = lambda rid: rid.split("#")[0].rsplit("_", 1)[0]  # noqa: E731 - ShareGPT parts ID_0, ID_1, ...
    assert not {base(r["id"]) for r in train} & {base(r["id"]) for r in val}  # parts of a chat stay together
    overlap = [p for p in prompts if p[-1]["content"] in train_firsts]
    # ShareGPT repeats a few popular prompts across conversations; a val conversation is never a train one.
    assert len(overlap) <= 1
    short = heldout_prompts("sharegpt", n=5, max_chars=200)
    assert all(len(p[-1]["content"]) <= 200 for p in short)
