"""Turn raw records of any supported shape into normalised chat rows with a deterministic train/val split."""

# Shapes (detected per record): `tokenised` (`input_ids` + `loss_mask`), `messages` (OpenAI `role`/`content`),
# `conversations` (ShareGPT `from`/`value`), `prompt_completion` and `prompt` (prompt-only: kept only for
# `regenerate`, which writes the answers). A record that fits none, or is broken, is
# skipped and counted by reason in the summary; nothing here is fatal for one bad row.
#
# Contract for other parts of the workbench:
#     rows, summary = load_conversations("sharegpt", split="train")   # rows: [{"id", "messages": [...]}, ...]
#     prompts = heldout_prompts("sharegpt", n=50)                      # first user turns of val conversations

from __future__ import annotations

import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.data.options import DEFAULT_VAL_FRACTION
from engine.data.render.sources import BadRecord, SourceInfo, read_records
from engine.errors import WorkbenchError

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "all")
ROLE_MAP = {
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "model": "assistant",
    "user": "user", "human": "user",
    "system": "system", "developer": "system",
}


@dataclass
class DatasetSummary:
    """What loading found: shapes, kept/skipped rows by reason, split sizes, and a truncated source."""

    source: str
    split: str
    shapes: Counter = field(default_factory=Counter)
    rows_read: int = 0
    rows_kept: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> rows dropped
    skipped_at: dict = field(default_factory=dict)  # reason -> the first record numbers (1-based) dropped for it
    adjusted: Counter = field(default_factory=Counter)  # reason -> rows kept after a fix
    split_counts: Counter = field(default_factory=Counter)  # over rows read before max_samples stopped the scan
    truncated_source: bool = False
    bad_lines: dict[str, list[int]] = field(default_factory=dict)  # reason -> first line numbers of unreadable rows

    @property
    def shape(self) -> str:
        """The shape found ("mixed: a, b" if several)."""
        names = [s for s, _ in self.shapes.most_common()]
        return names[0] if len(names) == 1 else ("mixed: " + ", ".join(names) if names else "none")

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "split": self.split, "shape": self.shape, "shapes": dict(self.shapes),
                "rows_read": self.rows_read, "rows_kept": self.rows_kept, "skipped": dict(self.skipped),
                "skipped_at": {k: list(v) for k, v in self.skipped_at.items()},
                "adjusted": dict(self.adjusted), "split_counts": dict(self.split_counts),
                "truncated_source": self.truncated_source, "bad_lines": self.bad_lines}

    def format(self) -> str:
        lines = [f"dataset {self.source}: shape {self.shape}; {self.rows_read} rows read, {self.rows_kept} kept "
                 f"(split {self.split})"]
        if self.truncated_source:
            lines.append("  the source file is truncated: only its complete records were used")
        if self.skipped:
            lines.append(f"  skipped {sum(self.skipped.values())}: {dict(self.skipped.most_common())}")
        for reason, numbers in self.bad_lines.items():
            more = self.skipped[reason] - len(numbers)
            lines.append(f"  {reason}: line {', '.join(map(str, numbers))}" + (f" and {more} more" if more > 0 else ""))
        if self.adjusted:
            lines.append(f"  adjusted: {dict(self.adjusted.most_common())}")
        return "\n".join(lines)


# -- shapes --------------------------------------------------------------------------------------


def detect_shape(record: Any) -> str | None:
    """Which supported shape a record has, or None."""
    if not isinstance(record, dict):
        return None
    if "input_ids" in record and "loss_mask" in record:
        return "tokenised"
    if isinstance(record.get("messages"), list):
        return "messages"
    if isinstance(record.get("conversations"), list):
        return "conversations"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "prompt" in record:
        return "prompt"
    return None


def _text(content: Any) -> str | None:
    """Plain text of a message content (string, or OpenAI parts with only text); None if not text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None


def _turns(record: dict, shape: str) -> list[tuple[Any, Any]]:
    """(raw role, raw content) pairs of a chat-shaped record."""
    if shape == "messages":
        return [(m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None) for m in record["messages"]]
    if shape == "conversations":
        return [(t.get("from", t.get("role")), t.get("value", t.get("content"))) if isinstance(t, dict)
                else (None, None) for t in record["conversations"]]
    prompt, completion = record["prompt"], record.get("completion")
    turns: list[tuple[Any, Any]] = []
    if record.get("system"):
        turns.append(("system", record["system"]))
    for part, role in ((prompt, "user"), (completion, "assistant")):
        if part is None and shape == "prompt":
            continue
        if isinstance(part, list):  # conversational prompt/completion: lists of messages
            turns += [(m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None) for m in part]
        else:
            turns.append((role, part))
    return turns


def normalise_messages(turns: list[tuple[Any, Any]], adjusted: Counter | None = None, *,
                       prompt_only: bool = False) -> tuple[list | None, str]:
    """Map roles and contents to [{"role", "content"}]; return (messages, "") or (None, skip reason).

    `prompt_only` keeps conversations without an assistant turn (what `regenerate` answers)."""
    messages = []
    for raw_role, raw_content in turns:
        role = ROLE_MAP.get(str(raw_role).lower()) if raw_role is not None else None
        if role is None:
            return None, f"unknown role '{raw_role}'"
        content = _text(raw_content)
        if content is None:
            return None, "non-text content"
        if not content.strip():
            return None, "empty turn"
        messages.append({"role": role, "content": content})
    if not messages:
        return None, "no turns"
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    if first < len(messages) and messages[first]["role"] == "assistant":
        # ShareGPT splits long chats; a part may open with the assistant. Its first answer has no question.
        first_user = next((i for i in range(first, len(messages)) if messages[i]["role"] == "user"), None)
        if first_user is None:
            return None, "no user turn"
        messages = messages[:first] + messages[first_user:]
        if adjusted is not None:
            adjusted["leading assistant turns dropped"] += 1
    if not any(m["role"] == "user" for m in messages):
        return None, "no user turn"
    if not prompt_only and not any(m["role"] == "assistant" for m in messages):
        return None, "no assistant turn"
    return messages, ""


def normalise_tokenised(record: dict) -> tuple[dict | None, str]:
    ids, mask = record["input_ids"], record["loss_mask"]
    try:
        ids, mask = [int(t) for t in ids], [int(m) for m in mask]
    except (TypeError, ValueError):
        return None, "non-integer input_ids/loss_mask"
    if not ids:
        return None, "empty input_ids"
    if len(ids) != len(mask):
        return None, "input_ids/loss_mask length mismatch"
    if any(m not in (0, 1) for m in mask):
        return None, "loss_mask not 0/1"
    return {"input_ids": ids, "loss_mask": mask}, ""


def normalise_record(record: Any, adjusted: Counter | None = None, *,
                     prompt_only: bool = False) -> tuple[str | None, dict | None, str]:
    """(shape, normalised row without id, "") or (shape, None, skip reason) for one raw record."""
    if isinstance(record, BadRecord):
        return None, None, record.reason
    shape = detect_shape(record)
    if shape is None:
        return None, None, "unknown shape"
    if shape == "tokenised":
        row, reason = normalise_tokenised(record)
        return shape, row, reason
    messages, reason = normalise_messages(_turns(record, shape), adjusted, prompt_only=prompt_only)
    return shape, ({"messages": messages} if messages else None), reason


# -- split ---------------------------------------------------------------------------------------


def split_of(key: str, val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0) -> str:
    """'val' or 'train' from a hash of (seed, row key): the same row always lands in the same split."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "big") / 2**64 < val_fraction else "train"


def _record_key(record: Any, index: int) -> str:
    rid = record.get("id") if isinstance(record, dict) else None
    return str(rid) if isinstance(rid, (str, int)) and str(rid) else f"row-{index}"


# -- loading -------------------------------------------------------------------------------------


def _split_key(key: str, name_or_path: str) -> str:
    """What the split hashes: the row key, except that the built-in ShareGPT's parts `ID_0, ID_1, ...` of one
    long chat share the key `ID`, so a conversation never has parts on both sides of the split."""
    return _SHAREGPT_PART.sub("", key) if str(name_or_path) == "sharegpt" else key


_SHAREGPT_PART = re.compile(r"_\d+$")


def _is_later_part(key: str, name_or_path: str) -> bool:
    return str(name_or_path) == "sharegpt" and bool(_SHAREGPT_PART.search(key)) and not key.endswith("_0")


def _iter_rows(name_or_path: str, summary: DatasetSummary, val_fraction: float,
               seed: int, prompt_only: bool = False) -> Iterator[tuple[dict, bool]]:
    """(row, continued) for the requested split; `continued` = leading assistant turns were dropped."""
    if summary.split not in SPLITS:
        raise WorkbenchError(f"unknown split '{summary.split}'", hint="use train, val or all")
    if not 0.0 <= val_fraction < 1.0:
        raise WorkbenchError(f"val_fraction {val_fraction} is outside [0, 1)", hint="use e.g. 0.02")
    info = SourceInfo()
    seen: Counter = Counter()
    for index, record in enumerate(read_records(name_or_path, info)):
        summary.rows_read += 1
        summary.truncated_source = info.truncated
        before = summary.adjusted["leading assistant turns dropped"]
        shape, row, reason = normalise_record(record, summary.adjusted, prompt_only=prompt_only)
        if shape:
            summary.shapes[shape] += 1
        if row is None:
            summary.skipped[reason] += 1
            if isinstance(record, BadRecord) and record.line is not None:
                numbers = summary.bad_lines.setdefault(reason, [])
                if len(numbers) < 5:
                    numbers.append(record.line)
            at = summary.skipped_at.setdefault(reason, [])
            if len(at) < 10:
                at.append(index + 1)
            continue
        key = _record_key(record, index)
        split = split_of(_split_key(key, name_or_path), val_fraction, seed)  # duplicates stay in one split
        summary.split_counts[split] += 1
        if summary.split != "all" and split != summary.split:
            continue
        seen[key] += 1
        row_id = key if seen[key] == 1 else f"{key}#{seen[key]}"
        summary.rows_kept += 1
        continued = summary.adjusted["leading assistant turns dropped"] > before or _is_later_part(key, name_or_path)
        yield {"id": row_id, **row}, continued
    summary.truncated_source = info.truncated


def iter_conversations(name_or_path: str, summary: DatasetSummary, *, val_fraction: float = DEFAULT_VAL_FRACTION,
                       seed: int = 0, prompt_only: bool = False) -> Iterator[dict]:
    """Normalised rows of the requested split (summary.split), in dataset order, with unique ids.

    `prompt_only` also keeps rows without an assistant turn (a prompt-only dataset, for `regenerate`)."""
    for row, _ in _iter_rows(name_or_path, summary, val_fraction, seed, prompt_only):
        yield row


def load_conversations(name_or_path: str = "sharegpt", split: str = "train",
                       val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0,
                       max_samples: int | None = None, prompt_only: bool = False) -> tuple[list[dict], DatasetSummary]:
    """Load a built-in name or local path as `(rows, summary)`.

    rows: `{"id": str, "messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}` or, for
    already-tokenised data, `{"id", "input_ids", "loss_mask"}`; in dataset order. `split` defaults to "train"
    so that the held-out conversations (`heldout_prompts`) are never trained on by default. `max_samples`
    takes the first rows of the split; the split of a row never depends on it.
    """
    summary = DatasetSummary(source=str(name_or_path), split=split)
    rows = []
    for row in iter_conversations(name_or_path, summary, val_fraction=val_fraction, seed=seed,
                                  prompt_only=prompt_only):
        rows.append(row)
        if max_samples is not None and len(rows) >= max_samples:
            break
    _log_summary(summary)
    return rows, summary


def _log_summary(summary: DatasetSummary) -> None:
    log.info("dataset %s: found shape %s; %d rows kept of %d read%s", summary.source, summary.shape,
             summary.rows_kept, summary.rows_read,
             f"; skipped {dict(summary.skipped)}" if summary.skipped else "")


def first_user_turn(messages: list[dict]) -> list[dict] | None:
    """The messages up to and including the first user turn (keeps a system turn before it)."""
    for i, m in enumerate(messages):
        if m["role"] == "user":
            return [dict(x) for x in messages[: i + 1] if x["role"] in ("system", "user")]
    return None


def heldout_prompts(name: str = "sharegpt", n: int = 50, seed: int = 0, *,
                    val_fraction: float = DEFAULT_VAL_FRACTION, max_chars: int | None = None) -> list[list[dict]]:
    """First user turns (with any system turn before them) of val-split conversations, in dataset order.

    The same (name, seed, val_fraction) always gives the same prompts, and none of them comes from a
    conversation of the train split, so a draft is never evaluated on prompts it was trained on.
    Rows that open mid-chat (leading assistant turns dropped, or ShareGPT parts after `_0`: "please go on")
    are not used. `max_chars` skips prompts whose user text is longer (keeps CPU benchmarks short).
    """
    summary = DatasetSummary(source=str(name), split="val")
    prompts: list[list[dict]] = []
    for row, continued in _iter_rows(name, summary, val_fraction, seed):
        prompt = None if continued else first_user_turn(row.get("messages") or [])
        if prompt is None or (max_chars is not None and len(prompt[-1]["content"]) > max_chars):
            continue
        prompts.append(prompt)
        if len(prompts) >= n:
            break
    if len(prompts) < n:
        log.warning("only %d held-out prompts available in %s (asked for %d)", len(prompts), name, n)
    return prompts

