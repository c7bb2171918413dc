"""What every measurement record says about how it was made: the command, the CPU (model name and kind), the dtype,
the day and the torch version."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from engine.cpu import cpu_identity
from engine.options import flag_words

# The fields each record under benchmarks/results (and each JSON a measuring command writes) carries.
FIELDS = ("command", "cpu", "cpu_kind", "dtype", "date", "torch")


def provenance(dtype: str | Sequence[str], *, command: str | None = None, on_cpu: bool = True,
               torch_version: str | None = None) -> dict[str, Any]:
    """The record's provenance fields. `dtype` is what was measured ("bf16"; a list where one record measures
    several: then `dtypes`); `command` is left out where the caller adds it; `on_cpu=False` (measured on an
    accelerator) leaves the CPU out; `torch_version` is the torch that ran the measurement when it is not this
    process's (vLLM's own environment)."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    machine = cpu_identity() if on_cpu else {"cpu": None, "cpu_kind": None}
    dtypes = {"dtype": dtype} if isinstance(dtype, str) else {"dtypes": list(dtype)}
    named = {"command": command} if command is not None else {}
    return {**named, **machine, **dtypes, "date": time.strftime("%Y-%m-%d"), "torch": str(torch_version)}


def engine_command(words: Sequence[Any]) -> str:
    """`python -m engine <words>`: the command line a record names (the words as given, joined by spaces)."""
    return " ".join(["python -m engine", *(str(w) for w in words)])


def command_of(name: str, options: dict[str, Any]) -> str:
    """`python -m engine NAME --flag value ...` from the options a CLI command ran with: None and False left out,
    True a bare flag, a list comma-joined."""
    words: list[Any] = [name]
    for key, value in options.items():
        if value is not None:
            words += flag_words(key, value, store_true=True)
    return engine_command(words)


def rows_of(data: Any) -> list[dict[str, Any]]:
    """The rows of a record of rows (a curve, a k sweep): {"rows": [...], provenance...}, or a bare list (records
    written before they carried their provenance)."""
    rows = data.get("rows", []) if isinstance(data, dict) else data
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
