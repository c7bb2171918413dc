"""Glue for the offline evaluator in the app: its command line, where its results land, and their table rows."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from engine import jobs as engine_jobs


def result_path(draft: str) -> str:
    return str(engine_jobs.runs_dir() / "evaluate" / f"{Path(draft).name}-{time.strftime('%Y%m%d-%H%M%S')}.json")


def evaluate_argv(draft: str, target: str, *, num_prompts: int, max_new_tokens: int, out: str,
                  forecast: bool = True) -> list[str]:
    argv = ["evaluate", "--draft", draft, "--target", target, "--num-prompts", str(num_prompts),
            "--max-new-tokens", str(max_new_tokens), "--json", out]
    return argv + (["--forecast"] if forecast else [])


def results(draft: str | None = None) -> list[tuple[engine_jobs.Job, dict[str, Any]]]:
    """Finished evaluate jobs (newest first) with their JSON, optionally only those of one draft folder."""
    from ui.jobs import argv_value

    found = []
    for job in engine_jobs.list_jobs(engine_jobs.runs_dir()):
        if job.kind != "evaluate" or job.status.state != "done":
            continue
        if draft is not None and str(Path(argv_value(job, "--draft") or "").resolve()) != str(Path(draft).resolve()):
            continue
        out = argv_value(job, "--json")
        try:
            found.append((job, json.loads(Path(out).read_text())))
        except (OSError, TypeError, ValueError):
            continue
    return found


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per k: the walk's acceptance, per position, the all-positions average, the forecast speedup."""
    fc = (result.get("forecast") or {}).get("by_k", {})
    rows = []
    for key, acc in result.get("by_k", {}).items():
        f = fc.get(key) or {}
        rows.append({"k": int(key),
                     "mean acceptance length (decoding walk)": _round(acc.get("mean_acceptance_length")),
                     "per-position acceptance": ", ".join(f"{x:.2f}" for x in acc.get("per_position_acceptance", [])),
                     "all-positions average": _round(acc.get("all_positions_acceptance_length")),
                     "step cost (target steps)": _round(f.get("step_cost")),
                     "forecast speedup": _round(f.get("speedup"))})
    return rows


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


__all__ = ["evaluate_argv", "result_path", "results", "table_rows"]
