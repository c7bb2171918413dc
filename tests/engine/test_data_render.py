"""Rendering: assistant-only loss masks on every turn, default system turns, truncation, previews."""

from __future__ import annotations

import json

import pytest

from engine.data.render.chat import (
    format_segments,
    mask_segments,
    preview,
    render_dataset,
    render_messages,
    render_rows,
)
from engine.errors import WorkbenchError

MULTI = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "That is 6, of course."},
]


def _loss_texts(tokenizer, ids, mask):
    return [t for t, loss in mask_segments(tokenizer, ids, mask) if loss]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_every_assistant_turn_is_masked_in_and_nothing_else(tiny_targets, arch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets[arch])
    ids, mask, truncated = render_messages(tok, MULTI)
    assert not truncated and len(ids) == len(mask)
    assert _loss_texts(tok, ids, mask) == ["It is 4.<|im_end|>\n", "That is 6, of course.<|im_end|>\n"]
    prompt_text = "".join(t for t, loss in mask_segments(tok, ids, mask) if not loss)
    assert "What is 2+2?" in prompt_text and "Be brief." in prompt_text and "<|im_start|>assistant\n" in prompt_text
    assert tok.decode(ids) == tok.apply_chat_template(MULTI, tokenize=False)


def test_default_system_turn_of_the_template_is_not_a_loss(tiny_targets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    ids, mask, _ = render_messages(tok, MULTI[1:])
    segments = mask_segments(tok, ids, mask)
    assert segments[0][0].startswith("<|im_start|>system\nYou are a tiny test assistant") and not segments[0][1]
    assert _loss_texts(tok, ids, mask) == ["It is 4.<|im_end|>\n", "That is 6, of course.<|im_end|>\n"]


def test_builtin_smollm2_masks_match_its_chatml_template(builtin_target):
    tok = builtin_target.tokenizer
    ids, mask, _ = render_messages(tok, MULTI[1:])
    text = tok.decode(ids)
    assert "You are a helpful AI assistant named SmolLM" in text  # the template's default system turn
    assert _loss_texts(tok, ids, mask) == ["It is 4.<|im_end|>\n", "That is 6, of course.<|im_end|>\n"]


def test_truncation_cuts_ids_and_mask_and_drops_rows_without_loss(tiny_targets):
    from transformers import AutoTokenizer

    from engine.data.render.datasets import DatasetSummary

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    full, full_mask, _ = render_messages(tok, MULTI)
    ids, mask, truncated = render_messages(tok, MULTI, max_length=len(full) - 5)
    assert truncated and ids == full[:-5] and mask == full_mask[:-5]
    first_loss = full_mask.index(1)
    summary = DatasetSummary(source="x", split="all")
    rows = [{"id": "a", "messages": MULTI}, {"id": "b", "messages": MULTI}]
    assert render_rows(tok, rows, max_length=first_loss, summary=summary) == []
    assert summary.skipped == {"no loss tokens after truncation": 2}
    kept = render_rows(tok, rows, max_length=first_loss + 3, limit=1)
    assert len(kept) == 1 and kept[0].num_loss_tokens == 3 and kept[0].truncated


def test_truncating_long_chats_early_gives_the_same_tokens_and_mask(tiny_targets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    words = "the quick brown fox jumps over the lazy dog 1 2 3 and then some, def add(a, b): return a + b".split()
    chat = []
    for i in range(12):
        chat += [{"role": "user", "content": " ".join(words[(i + k) % len(words)] for k in range(60 + i))},
                 {"role": "assistant", "content": " ".join(words[(i * 3 + k) % len(words)] for k in range(90))}]
    full_ids, full_mask, _ = render_messages(tok, chat)
    for max_length in (40, 300, 1000):
        ids, mask, truncated = render_messages(tok, chat, max_length=max_length)
        assert truncated and ids == full_ids[:max_length] and mask == full_mask[:max_length]


def test_tokenised_rows_pass_through_with_truncation(tiny_targets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    rows = render_rows(tok, [{"id": "t", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]}], max_length=3)
    assert rows[0].input_ids == [5, 6, 7] and rows[0].loss_mask == [0, 0, 1] and rows[0].truncated


def test_preview_segments_cover_the_whole_text(tiny_targets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    segments = preview(tok, MULTI)
    assert "".join(t for t, _ in segments) == tok.apply_chat_template(MULTI, tokenize=False)
    assert [loss for _, loss in segments] == [False, True, False, True]
    assert "⟦It is 4.<|im_end|>\n⟧" in format_segments(segments)
    assert "\x1b[32m" in format_segments(segments, color=True)


def test_missing_chat_template_is_a_clear_error(tiny_targets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    tok.chat_template = None
    with pytest.raises(WorkbenchError, match="no chat template"):
        render_rows(tok, [{"id": "a", "messages": MULTI}])


def test_render_dataset_is_deterministic_and_max_samples_is_a_prefix(tiny_targets, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_targets["llama"])
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                                                    {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                         for i in range(30)))
    rows, summary, stats = render_dataset(str(f), tok, split="all", max_length=64)
    few, _, _ = render_dataset(str(f), tok, split="all", max_samples=7, max_length=64)
    assert [r.id for r in few] == [r.id for r in rows[:7]] and few[3].input_ids == rows[3].input_ids
    assert stats.rows == 30 and stats.loss_tokens == sum(r.num_loss_tokens for r in rows)
