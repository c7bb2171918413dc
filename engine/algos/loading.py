"""Loading a draft folder through the registry: its algorithm, its model paired with a target, its proposer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.algos import ALGOS, algorithm_for_config
from engine.format.checkpoint import read_config_dict


def draft_algorithm(draft_path: str | Path):
    """The registered algorithm of a draft folder (a clear error for types we validate but do not run)."""
    return algorithm_for_config(read_config_dict(draft_path))


def load_draft(draft_path: str | Path, target, **options: Any):
    """The draft model of a folder (any registered algorithm), paired with `target`, in eval mode."""
    return draft_algorithm(draft_path).load(draft_path, target, **options)


def proposer_for(draft, **options: Any):
    """A fresh proposer over a loaded draft model (its algorithm read from the draft's own config)."""
    return algorithm_for_config(draft.config).proposer(draft, **options)


def load_draft_proposer(draft_path: str | Path, target, **options: Any):
    """A proposer for any supported draft folder, chosen by its `speculators_model_type`."""
    return proposer_for(load_draft(draft_path, target), **options)


def is_algorithm(name: str) -> bool:
    """Whether `name` is a registered algorithm (a bench/generate method naming one means "the draft")."""
    return name in ALGOS
