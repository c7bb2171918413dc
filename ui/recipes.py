"""Where the recipe's measurements come from: each recipe's work folder (curve.json, sweep.json) and the model
cards of the drafts on disk (the shipped draft's card holds its curve and k sweep as tables)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.fsutil import read_json
from engine.provenance import rows_of
from engine.recipes.model_card import curve_from_card, sweep_from_card
from engine.recipes.spec import CONFIGS, load_recipe
from ui.catalog import find_drafts

log = logging.getLogger(__name__)


@dataclass
class RecipeResults:
    """The acceptance curve over checkpoints and the k sweep of one trained draft."""

    label: str
    where: str  # the folder or card the numbers were read from
    curve: list[dict[str, Any]] = field(default_factory=list)  # one row per kept checkpoint
    sweep: list[dict[str, Any]] = field(default_factory=list)  # one row per k
    rounded: bool = False  # read from a card's tables (2 decimals, tokens in thousands)


def _load_list(path: Path) -> list[dict[str, Any]]:
    try:
        return rows_of(read_json(path))
    except (OSError, ValueError):
        return []


def from_work(name: str, work: str | Path) -> RecipeResults | None:
    """A recipe's own result files (exact numbers), None when it has written neither yet."""
    work = Path(work)
    found = RecipeResults(f"recipe · {name}", str(work), _load_list(work / "curve.json"),
                          _load_list(work / "sweep.json"))
    return found if found.curve or found.sweep else None


def from_card(label: str, draft: str | Path) -> RecipeResults | None:
    """A draft's model card tables (as the card rounds them), None when the card has neither table."""
    card = Path(draft) / "README.md"
    try:
        text = card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = RecipeResults(label, str(card), curve_from_card(text), sweep_from_card(text), rounded=True)
    return found if found.curve or found.sweep else None


def all_results() -> dict[str, RecipeResults]:
    """The shipped drafts' cards first, then every recipe in configs/ that has measured something."""
    out: dict[str, RecipeResults] = {}
    for entry in find_drafts():
        if entry.origin == "shipped":
            found = from_card(f"shipped · {Path(entry.path).name}", entry.path)
            if found:
                out[found.label] = found
    for config in sorted(CONFIGS.glob("*.yaml")):
        try:
            recipe = load_recipe(str(config))
        except Exception as exc:  # noqa: BLE001 - a broken recipe file is the recipe command's to report
            log.info("skipping recipe %s: %s", config, exc)
            continue
        found = from_work(recipe["name"], recipe["work"])
        if found:
            out[found.label] = found
    return out


def shipped_curve(draft: str | None) -> RecipeResults | None:
    """The acceptance curve over checkpoints in a (shipped) draft's model card: the reference beside your runs."""
    found = from_card("shipped draft", draft) if draft else None
    return found if found and found.curve else None


def sweep_rows(results: RecipeResults) -> list[dict[str, Any]]:
    """The k sweep as table rows (rounded for display)."""
    return [{"k": r.get("k"), "mean acceptance length": _round(r.get("mean_acceptance_length")),
             "per-position acceptance": ", ".join(f"{x:.2f}" for x in r.get("per_position_acceptance") or []),
             "speedup": _round(r.get("speedup")),
             "95% interval": "–" if not (ci := (r.get("spread") or {}).get("ci95")) else f"{ci[0]:.2f}–{ci[1]:.2f}",
             "identical to baseline": "yes" if r.get("identical_to_baseline") else "no"} for r in results.sweep]


def curve_rows(results: RecipeResults) -> list[dict[str, Any]]:
    """The acceptance curve as table rows (rounded for display)."""
    return [{"step": r.get("step"), "training tokens": int(r.get("training_tokens") or 0),
             "mean acceptance length": _round(r.get("mean_acceptance_length")),
             "per-position acceptance": ", ".join(f"{x:.2f}" for x in r.get("per_position_acceptance") or [])}
            for r in results.curve]


def _round(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(float(x), digits)


__all__ = ["RecipeResults", "all_results", "curve_rows", "from_card", "from_work", "shipped_curve", "sweep_rows"]
