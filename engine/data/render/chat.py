"""Render chat rows with the target's chat template into token ids with an assistant-only loss mask."""

# Assistant spans are found by rendering, for each assistant turn j, the prefix `messages[:j]` with
# `add_generation_prompt=True` and the conversation `messages[:j+1]`: the characters between the two are the
# turn (its content and end-of-turn marker). The full conversation is tokenised once with character offsets and
# every token that starts inside a span is a loss token. This holds for templates that add a default system turn
# (SmolLM2's ChatML) and for every assistant turn of a multi-turn chat.

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.data.render.datasets import DEFAULT_VAL_FRACTION, DatasetSummary, iter_conversations
from engine.errors import WorkbenchError

log = logging.getLogger(__name__)


@dataclass
class RenderedRow:
    """One training sample: token ids and a 0/1 loss mask of the same length."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self) -> dict:
        return {"id": self.id, "input_ids": self.input_ids, "loss_mask": self.loss_mask}


@dataclass
class RenderStats:
    """Token counts over the rendered rows (the dataset summary holds the skipped rows)."""

    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    truncated: int = 0

    def add(self, row: RenderedRow) -> None:
        self.rows += 1
        self.tokens += row.num_tokens
        self.loss_tokens += row.num_loss_tokens
        self.truncated += int(row.truncated)

    def to_json(self) -> dict:
        return {"rows": self.rows, "tokens": self.tokens, "loss_tokens": self.loss_tokens, "truncated": self.truncated}


def _template(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def require_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise WorkbenchError("the target's tokenizer has no chat template, so chat rows cannot be rendered",
                             hint="use an instruct/chat target, or give already-tokenised rows (input_ids + loss_mask)")


def assistant_spans(tokenizer, messages: list[dict], notes: Counter | None = None, *, text: str | None = None,
                    stop_at: int | None = None) -> tuple[str, list[tuple[int, int]]]:
    """(rendered text, [(start, end) character spans of assistant turns]); turns from `stop_at` on are skipped."""
    text = _template(tokenizer, messages, False) if text is None else text
    spans = []
    cursor = 0
    for j, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = _template(tokenizer, messages[:j], True)
        if stop_at is not None and len(prefix) >= stop_at and text.startswith(prefix):
            break  # this turn starts after the truncation point
        upto = _template(tokenizer, messages[: j + 1], False)
        if text.startswith(upto) and upto.startswith(prefix) and len(prefix) >= cursor:
            spans.append((len(prefix), len(upto)))
            cursor = len(upto)
            continue
        # Templates that rewrite earlier turns (e.g. drop reasoning) are not prefix-stable: find the content.
        start = text.find(message["content"], cursor)
        if start < 0:
            raise ValueError("assistant turn not found in the rendered conversation")
        if notes is not None:
            notes["template not prefix-stable: content-only span"] += 1
        spans.append((start, start + len(message["content"])))
        cursor = start + len(message["content"])
    return text, spans


def _tokenize(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    """Token ids and character offsets (None for tokenizers without offsets)."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), None


def _mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """A token is a loss token when it starts inside an assistant span."""
    mask = [0] * len(offsets)
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= start < spans[k][1] and end > start:
            mask[t] = 1
    return mask


def _mask_by_prefix(tokenizer, text: str, spans: list[tuple[int, int]], n: int) -> list[int]:
    """Slow tokenizers (no offsets): token boundaries from the token counts of text prefixes."""
    def count(s: str) -> int:
        return len(tokenizer(s, add_special_tokens=False)["input_ids"])

    mask = [0] * n
    for start, end in spans:
        for t in range(count(text[:start]), min(count(text[:end]), n)):
            mask[t] = 1
    return mask


# A long conversation is tokenised only up to its first max_length * _CHARS_PER_TOKEN + _EXTRA_CHARS characters
# when that yields at least max_length + _TOKEN_MARGIN tokens: the first max_length tokens are then those of the
# whole text (the cut can only change how the last word before it is split). Checked equal on the first 2,000
# ShareGPT rows at 32, 256, 768 and 2048 tokens (tests/engine/test_data_render.py checks long chats).
_CHARS_PER_TOKEN = 8
_EXTRA_CHARS = 2048
_TOKEN_MARGIN = 64


def render_messages(tokenizer, messages: list[dict], max_length: int | None = None,
                    notes: Counter | None = None) -> tuple[list[int], list[int], bool]:
    """(input_ids, loss_mask, truncated) of one conversation; right-truncated to `max_length` tokens."""
    text = _template(tokenizer, messages, False)
    ids, offsets, covered = None, None, None
    head = None if max_length is None else max_length * _CHARS_PER_TOKEN + _EXTRA_CHARS
    if head is not None and len(text) > head:
        head_ids, head_offsets = _tokenize(tokenizer, text[:head])
        if head_offsets is not None and len(head_ids) >= max_length + _TOKEN_MARGIN:
            ids, offsets = head_ids, head_offsets
            covered = offsets[max_length - 1][1]  # characters the kept tokens cover
    _, spans = assistant_spans(tokenizer, messages, notes, text=text, stop_at=covered)
    if ids is None:
        ids, offsets = _tokenize(tokenizer, text)
    if offsets is not None:
        mask = _mask_from_offsets(offsets, spans)
    else:
        mask = _mask_by_prefix(tokenizer, text, spans, len(ids))
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask, truncated


def render_row(tokenizer, row: dict, max_length: int | None = None, notes: Counter | None = None) -> RenderedRow:
    """Render a normalised row (chat or already tokenised) into a RenderedRow."""
    if "input_ids" in row:
        ids, mask = list(row["input_ids"]), list(row["loss_mask"])
        truncated = max_length is not None and len(ids) > max_length
        if truncated:
            ids, mask = ids[:max_length], mask[:max_length]
        return RenderedRow(str(row["id"]), ids, mask, truncated)
    ids, mask, truncated = render_messages(tokenizer, row["messages"], max_length, notes)
    return RenderedRow(str(row["id"]), ids, mask, truncated)


def render_rows(tokenizer, rows: Iterable[dict], max_length: int | None = None, *, limit: int | None = None,
                summary: DatasetSummary | None = None, stats: RenderStats | None = None) -> list[RenderedRow]:
    """Render rows in order, skipping (and counting in `summary.skipped`) those without a loss token.

    `limit` stops after that many rendered rows, so `--max-samples N` yields N samples whenever the data has them.
    """
    notes = summary.adjusted if summary is not None else Counter()
    skipped = summary.skipped if summary is not None else Counter()
    checked = False
    out: list[RenderedRow] = []
    for row in rows:
        if limit is not None and len(out) >= limit:
            break
        if "messages" in row and not checked:
            require_chat_template(tokenizer)
            checked = True
        try:
            rendered = render_row(tokenizer, row, max_length, notes)
        except WorkbenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template that fails on one row skips that row
            skipped[f"template error: {type(exc).__name__}"] += 1
            continue
        if rendered.num_loss_tokens == 0:
            skipped["no loss tokens" + (" after truncation" if rendered.truncated else "")] += 1
            continue
        out.append(rendered)
        if stats is not None:
            stats.add(rendered)
    return out


def render_dataset(name_or_path: str, tokenizer, *, split: str = "train", max_samples: int | None = None,
                   max_length: int | None = None, val_fraction: float = DEFAULT_VAL_FRACTION,
                   seed: int = 0) -> tuple[list[RenderedRow], DatasetSummary, RenderStats]:
    """Load, normalise, split and render a dataset: the rows `extract` and `prepare` work on.

    Row i of the result is sample i of an extraction (`hs_{i}.safetensors`); the result is deterministic for
    the same arguments, and a smaller `max_samples` yields a prefix of a larger one.
    """
    summary = DatasetSummary(source=str(name_or_path), split=split)
    stats = RenderStats()
    rows = iter_conversations(name_or_path, summary, val_fraction=val_fraction, seed=seed)
    rendered = render_rows(tokenizer, rows, max_length, limit=max_samples, summary=summary, stats=stats)
    log.info("rendered %d rows of %s (%d tokens, %d loss tokens, %d truncated)", stats.rows, name_or_path,
             stats.tokens, stats.loss_tokens, stats.truncated)
    return rendered, summary, stats


# -- preview -------------------------------------------------------------------------------------


def mask_segments(tokenizer, input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[tuple[str, bool]]:
    """Decode runs of equal mask value: [(text, is_loss), ...] in order (what the UI colours)."""
    segments: list[tuple[str, bool]] = []
    start = 0
    for t in range(1, len(input_ids) + 1):
        if t == len(input_ids) or loss_mask[t] != loss_mask[start]:
            text = tokenizer.decode(list(input_ids[start:t]), skip_special_tokens=False)
            segments.append((text, bool(loss_mask[start])))
            start = t
    return segments


def preview(tokenizer, row: dict | list[dict] | RenderedRow, max_length: int | None = None) -> list[tuple[str, bool]]:
    """The rendered text of a row (messages list, normalised row or RenderedRow) as (text, is_loss) segments."""
    if isinstance(row, list):
        row = {"id": "preview", "messages": row}
    if not isinstance(row, RenderedRow):
        if "messages" in row:
            require_chat_template(tokenizer)
        row = render_row(tokenizer, row, max_length)
    return mask_segments(tokenizer, row.input_ids, row.loss_mask)


def format_segments(segments: list[tuple[str, bool]], *, color: bool = False) -> str:
    """Plain text with loss spans marked: green when `color`, else between ⟦ and ⟧."""
    if color:
        return "".join(f"\x1b[32m{t}\x1b[0m" if loss else t for t, loss in segments)
    return "".join(f"⟦{t}⟧" if loss else t for t, loss in segments)
