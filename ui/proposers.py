"""The proposer settings the pages offer beside a draft: its confidence cut (p-min) and draft + n-gram, in words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.algos import ALGOS, algorithm_for_config
from engine.errors import WorkbenchError
from engine.format.checkpoint import read_config_dict
from engine.generate.ngram import NGRAM_MIN_MATCH
from engine.generate.options import GenerateOptions

P_MIN_HELP = GenerateOptions.model_fields["p_min"].description + ". 0 = off."
NGRAM_MIN_MATCH_HELP = GenerateOptions.model_fields["ngram_min_match"].description + "."


def _bounds(name: str) -> tuple[int, int]:
    """(ge, le) of a GenerateOptions field: what its flag takes."""
    meta = GenerateOptions.model_fields[name].metadata
    return (next(m.ge for m in meta if hasattr(m, "ge")), next(m.le for m in meta if hasattr(m, "le")))


MIN_MATCH_RANGE = _bounds("ngram_min_match")  # what --ngram-min-match takes
DEFAULT_MIN_MATCH = NGRAM_MIN_MATCH
METHOD_LABELS = {"draft": "draft", "draft_ngram": "draft + n-gram"}


def cut_titles() -> str:
    """The algorithms whose proposer makes the p-min cut, by title ("A, B and C")."""
    titles = [ALGOS.get(name).title for name in ALGOS.names() if ALGOS.get(name).p_min_cut]
    return " and ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 1 else titles)


def p_min_problem(draft: str | Path | None) -> str | None:
    """Why the confidence cut (p-min) does not apply to this draft, in words; None where its algorithm makes it."""
    if not draft:
        return "no draft is active (it cuts a draft's chain)"
    try:
        algorithm = algorithm_for_config(read_config_dict(draft))
    except (WorkbenchError, OSError, ValueError) as exc:
        return f"the draft's algorithm cannot be read ({exc})"
    if algorithm.p_min_cut:
        return None
    return f"it stops {cut_titles()} draft chains, and this draft is {algorithm.title}"


def p_min_value(value: float | None) -> float | None:
    """A form's p-min (0 = off) as the option takes it: None when off."""
    return float(value) if value else None


def settings_text(proposer: dict[str, Any] | None) -> str:
    """What a proposer drafted with, in words: "draft", "draft, p-min 0.30", "draft + n-gram (min match 3)"; a
    record without these settings (older evaluations) is the plain draft."""
    proposer = proposer or {}
    method = proposer.get("method") or "draft"
    text = METHOD_LABELS.get(method, method)
    if method == "draft_ngram":
        text += f" (min match {proposer.get('ngram_min_match') or DEFAULT_MIN_MATCH})"
    if proposer.get("p_min"):
        text += f", p-min {float(proposer['p_min']):.2f}"
    return text
