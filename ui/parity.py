"""Glue for the training–serving parity check in the app: its findings as table rows and a one-line verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.format.report import ValidationReport
from engine.measure.parity import DIFFERS, KEPT_RECORDS, UNKNOWN, parity


def check(draft: str, target: str | None, validated: ValidationReport | None = None) -> dict[str, Any]:
    """`python -m engine parity --draft DRAFT --target TARGET` as a dict (vLLM's defaults: bf16, its context);
    `validated`: the page's own `validate` report, so that the draft is not validated twice per rerun."""
    return parity(draft, target=target, errors=validated.errors if validated is not None else None)


def rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """One row per factor: what training saw, what vLLM will do, the verdict, what a difference does."""
    return [{"factor": f["factor"], "training": f["trained"], "serving (vLLM)": f["served"], "verdict": f["verdict"],
             "what a difference does": f["effect"] or "–"} for f in result["findings"]]


def summary(result: dict[str, Any]) -> str:
    """"2 differences, 1 factor not recorded (run: …)" in words."""
    if result["run"] is None:
        return ("No training run found beside this draft (its folder's parent holds no `config.yaml`), so only "
                "what the draft itself records is compared: `python -m engine parity --run RUN` names the run.")
    differs = [f["factor"] for f in result["findings"] if f["verdict"] == DIFFERS]
    unknown = sum(f["verdict"] == UNKNOWN for f in result["findings"])
    where = (f"the records its recipe kept for these weights, `{_relative(result['run'])}`" if result.get("kept")
             else f"training run `{result['run']}`")
    return (f"{len(differs)} difference(s)" + (f" ({', '.join(differs)})" if differs else "")
            + f", {unknown} factor(s) not recorded; {where}.")


def _relative(path: str) -> str:
    """A path inside the repository from its root (benchmarks/results/...), others as given."""
    root = KEPT_RECORDS.parents[1]
    return str(Path(path).relative_to(root)) if Path(path).is_relative_to(root) else path


__all__ = ["check", "rows", "summary"]
