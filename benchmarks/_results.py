"""What every benchmark script does at the end: the command that reproduces it, the table, the JSON record."""

from __future__ import annotations

import os
import sys
from typing import Any


def command_line(script: str, argv: list[str] | None) -> str:
    """`python benchmarks/<script> <its arguments>` as the user typed them (or as `main(argv)` was called)."""
    return f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)


def print_and_save(result: dict[str, Any], table: str, json_path: str | None,
                   dtype: str | list[str] | None = None) -> None:
    """Print the markdown table; write the result JSON (atomically, folders created) when asked, with its provenance
    (engine.provenance: the command, the CPU and its kind, `dtype` unless the result names its own, day, torch)."""
    from engine.provenance import provenance

    print(table)
    own = result.get("dtype") or result.get("dtypes")
    if not result.get("command") or not (own or dtype):
        raise ValueError("a benchmark record names its command and dtype")  # a script's mistake, not the user's
    for key, value in provenance(own or dtype).items():
        result.setdefault(key, value)  # a script's own "cpu" (its description of the CPU) stays
    # 1/5/15-minute load averages when the run ended: above the core count, other work shared the machine
    result.setdefault("load_average_at_end", [round(x, 2) for x in os.getloadavg()])
    result.setdefault("cores", os.cpu_count())
    if json_path:
        from engine.fsutil import atomic_write_json

        atomic_write_json(json_path, result)
        print(f"\nwrote {json_path}")
