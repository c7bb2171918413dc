"""Response regeneration: the target's own answers as history, batching, resume after a crash mid-write."""

from __future__ import annotations

import json

import pytest

import engine.data.answers.regenerate as rg
from engine.data.options import RegenerateOptions
from engine.data.render.datasets import load_conversations
from engine.errors import WorkbenchError
from testkit.chats import CHATS


@pytest.fixture
def spy(monkeypatch):
    """Record the histories handed to generation; answer deterministically (a stand-in for the model)."""
    calls = []

    def fake(target, histories, **kw):
        calls.append([list(h) for h in histories])
        return [(f"answer {len(h)}", 3, True) for h in histories]

    monkeypatch.setattr(rg, "generate_answers", fake)
    return calls


def test_multi_turn_history_uses_the_targets_own_answers(tiny_llama, tmp_path, spy):
    out = tmp_path / "r.jsonl"
    summary = rg.regenerate(tiny_llama, CHATS, RegenerateOptions(out=out, batch_size=8), progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["multi", "single", "third"]
    multi = rows[0]["messages"]
    assert [m["role"] for m in multi] == ["system", "user", "assistant", "user", "assistant"]
    assert "ORIGINAL" not in json.dumps(rows)
    assert len(spy) == 2 and len(spy[0]) == 3 and len(spy[1]) == 1  # turn 1 for all, turn 2 for "multi" only
    assert spy[1][0][2] == {"role": "assistant", "content": multi[2]["content"]}  # its own first answer
    assert summary.written == 3 and summary.answers == 4 and rows[0]["regenerated"]["target"]


def test_resume_skips_written_rows_and_drops_a_partial_line(tiny_llama, tmp_path, spy):
    out = tmp_path / "r.jsonl"
    rg.regenerate(tiny_llama, CHATS[:1], RegenerateOptions(out=out), progress=False)
    with open(out, "a") as f:
        f.write('{"id": "single", "messages": [{"role": "us')  # a crash in the middle of a write
    summary = rg.regenerate(tiny_llama, CHATS, RegenerateOptions(out=out, batch_size=1), progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["multi", "single", "third"]
    assert summary.already_done == 1 and summary.written == 2
    loaded, s = load_conversations(str(out), split="all")
    assert len(loaded) == 3 and not s.skipped


def test_max_turns_and_prompts_too_long(tiny_llama, tmp_path, spy):
    out = tmp_path / "r.jsonl"
    rg.regenerate(tiny_llama, CHATS, RegenerateOptions(out=out, max_turns=1), progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    summary = rg.regenerate(tiny_llama, CHATS,
                            RegenerateOptions(out=tmp_path / "short.jsonl", max_length=20, max_new_tokens=8),
                            progress=False)
    assert summary.written == 0 and summary.skipped["no answer (prompt too long or empty answer)"] == 3


def test_real_generation_with_the_tiny_target(tiny_llama, tmp_path):
    out = tmp_path / "r.jsonl"
    summary = rg.regenerate(tiny_llama, CHATS, RegenerateOptions(out=out, max_new_tokens=4, batch_size=2),
                            progress=False)
    assert summary.new_tokens > 0 and summary.answers + sum(summary.skipped.values()) >= 3
    for row in (json.loads(line) for line in out.read_text().splitlines()):
        assert row["messages"][-1]["role"] == "assistant" and row["messages"][-1]["content"]


@pytest.mark.parametrize("fused", [True, False])
def test_greedy_batched_answers_match_one_by_one(tiny_llama, monkeypatch, fused):
    if not fused:
        monkeypatch.setattr(rg, "fused_batch_problem", lambda model: "forced by the test")
    assert rg.decodes_fused(tiny_llama, 0.0) is fused
    histories = [CHATS[1]["messages"][:1], CHATS[0]["messages"][:2]]
    batched = rg.generate_answers(tiny_llama, histories, max_new_tokens=5, temperature=0.0)
    alone = [rg.generate_answers(tiny_llama, [h], max_new_tokens=5, temperature=0.0)[0] for h in histories]
    assert batched == alone  # left padding (transformers) or other rows (fused) does not change greedy answers


def test_the_fused_batch_gets_several_batches_at_a_time_and_keeps_the_batch_size_as_its_width(tiny_llama, tmp_path,
                                                                                             monkeypatch):
    calls = []
    real = rg.greedy_batch
    monkeypatch.setattr(rg, "greedy_batch", lambda model, prompts, *a, width=None, **kw: calls.append(
        (len(prompts), width)) or real(model, prompts, *a, width=width, **kw))
    n = 2 * rg.FUSED_GROUP + 3
    chats = [{"id": str(i), "messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(n)]
    rg.regenerate(tiny_llama, chats, RegenerateOptions(out=tmp_path / "r.jsonl", batch_size=2, max_new_tokens=3),
                  progress=False)
    assert calls == [(2 * rg.FUSED_GROUP, 2), (3, 2)]
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == n


def test_greedy_answers_on_the_fused_decoder_are_transformers_answers(builtin_target, monkeypatch, tmp_path):
    """The built-in target (fp32): the fused batch's greedy answers equal transformers' `generate`, and the rows say
    which way decoded them; sampling keeps transformers' way."""
    histories = [CHATS[1]["messages"][:1], CHATS[0]["messages"][:2],
                 [{"role": "user", "content": "List three uses of a paper clip."}]]
    assert rg.decodes_fused(builtin_target, 0.0) and not rg.decodes_fused(builtin_target, 0.7)
    fused = rg.generate_answers(builtin_target, histories, max_new_tokens=24, temperature=0.0)
    rg.regenerate(builtin_target, CHATS[1:2], RegenerateOptions(out=tmp_path / "a.jsonl", max_new_tokens=2),
                  progress=False)
    monkeypatch.setattr(rg, "fused_batch_problem", lambda model: "forced by the test")
    assert rg.generate_answers(builtin_target, histories, max_new_tokens=24, temperature=0.0) == fused
    rg.regenerate(builtin_target, CHATS[1:2], RegenerateOptions(out=tmp_path / "b.jsonl", max_new_tokens=2),
                  progress=False)
    assert [json.loads((tmp_path / f"{n}.jsonl").read_text())["regenerated"]["backend"] for n in "ab"] == [
        "fused", "transformers"]


def test_tokenised_rows_cannot_be_regenerated(tiny_llama, tmp_path):
    with pytest.raises(WorkbenchError, match="needs chat rows"):
        rg.regenerate(tiny_llama, [{"id": "t", "input_ids": [1], "loss_mask": [1]}],
                      RegenerateOptions(out=tmp_path / "x.jsonl"))


def test_a_file_being_written_is_refused(tmp_path):
    f, done = rg.open_output(tmp_path / "x.jsonl")
    try:
        with pytest.raises(WorkbenchError, match="being written by another job"):
            rg.open_output(tmp_path / "x.jsonl")
    finally:
        f.close()


def test_an_answer_hook_needs_only_the_tokenizer(tiny_targets, tmp_path):
    """The vLLM backend's path: a server answers, this process holds no weights."""
    target = rg.tokenizer_only(str(tiny_targets["llama"]))
    seen = []

    def answer(target, histories, **kw):
        seen.append(len(histories))
        return [("served answer", 2, True) for _ in histories]

    summary = rg.regenerate(target, CHATS, RegenerateOptions(out=tmp_path / "r.jsonl", batch_size=3), answer=answer,
                            progress=False)
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert seen == [3, 1] and summary.answers == 4 and rows[0]["regenerated"]["backend"] == "vllm"
    assert rows[1]["messages"][-1] == {"role": "assistant", "content": "served answer"}
