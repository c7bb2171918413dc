"""The docs' tables as the tests read them."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def families_table() -> tuple[list[str], dict[str, list[str]]]:
    """docs/families.md's families table: its header cells, and each row's cells under its family key (the
    `model_type` in the first cell's last backticks, e.g. `gemma4_text:moe`)."""
    header, rows = [], {}
    for line in (DOCS / "families.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or set(cells[0]) <= {"-"}:
            continue
        if cells[0].startswith("family"):
            header = cells
        elif cells[0].endswith("`)"):
            rows[cells[0].rsplit("(`", 1)[1].rstrip("`)")] = cells
    return header, rows
