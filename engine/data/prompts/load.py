"""Prompts for benchmarks and evaluation: a JSONL file, a built-in workload, or a dataset's held-out split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.data.prompts.workloads import WORKLOADS
from engine.errors import WorkbenchError


def load_prompts(spec: str, n: int | None = None, seed: int = 0, max_chars: int | None = 1500) -> list[dict[str, Any]]:
    """`--prompts`: a JSONL file of {"prompt": str} / {"messages": [...]} rows, a built-in workload (sharegpt: chat,
    humaneval: code), or a dataset (its held-out split: prompts the drafts never trained on), at most `max_chars`
    long."""
    path = Path(spec)
    if path.is_file():
        rows = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkbenchError(f"line {i} is not JSON ({exc.msg})", where=str(path)) from exc
            if not isinstance(row, dict) or not ({"prompt", "messages"} & set(row)):
                raise WorkbenchError(f"line {i} needs a 'prompt' or 'messages' key", where=str(path))
            rows.append(row)
        return rows[:n] if n else rows
    if spec in WORKLOADS:
        return WORKLOADS[spec].read(n or 20, seed, max_chars)
    if path.suffix == ".jsonl" and not path.exists():
        raise WorkbenchError(f"prompts file {spec} does not exist", hint="give an existing JSONL file, or a built-in "
                             f"workload: {', '.join(WORKLOADS)}")
    from engine.data.render.datasets import heldout_prompts

    return [{"messages": m} for m in heldout_prompts(spec, n=n or 20, seed=seed, max_chars=max_chars)]
