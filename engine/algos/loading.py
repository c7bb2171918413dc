"""Loading a draft folder through the registry (its algorithm, its model paired with a target), and the one proposer
factory by method name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.algos import ALGOS, algorithm_for_config
from engine.algos.base import check_p_min
from engine.algos.shipped import default_draft
from engine.errors import WorkbenchError
from engine.format.checkpoint import read_config_dict
from engine.generate.cpu_kernels import pack_draft_linears
from engine.generate.ngram import NGRAM_MIN_MATCH, DraftNgramProposer, NgramProposer
from engine.generate.options import METHODS
from engine.generate.proposers import Proposer


def draft_algorithm(draft_path: str | Path):
    """The registered algorithm of a draft folder (a clear error for types we validate but do not run)."""
    return algorithm_for_config(read_config_dict(draft_path))


def load_draft(draft_path: str | Path, target, **options: Any):
    """The draft model of a folder (any registered algorithm), paired with `target`, in eval mode."""
    return draft_algorithm(draft_path).load(draft_path, target, **options)


def proposer_for(draft, *, p_min: float | None = None, **options: Any):
    """A fresh proposer over a loaded draft model (its algorithm read from the draft's own config); `p_min` cuts its
    chain below that draft probability (refused, with the reason, for an algorithm that makes no such cut)."""
    algorithm = algorithm_for_config(draft.config)
    check_p_min(algorithm, p_min)
    return algorithm.proposer(draft, **options, **({"p_min": p_min} if p_min else {}))


def load_draft_proposer(draft_path: str | Path, target, **options: Any):
    """A proposer for any supported draft folder, chosen by its `speculators_model_type`."""
    return proposer_for(load_draft(draft_path, target), **options)


def is_algorithm(name: str) -> bool:
    """Whether `name` is a registered algorithm (a bench/generate method naming one means "the draft")."""
    return name in ALGOS


def load_decoding_draft(path: str | Path, target):
    """A draft model ready for decoding beside `target`: loaded, its linears packed where that pays on this CPU."""
    draft_model = load_draft(path, target)
    pack_draft_linears(draft_model)
    return draft_model


def make_proposer(method: str, target, *, draft: str | Path | None = None, draft_model=None,
                  prompt_lookup_min: int = 2, prompt_lookup_max: int = 5, ngram_min_match: int = NGRAM_MIN_MATCH,
                  **options: Any) -> Proposer | None:
    """`baseline` -> None, `ngram` -> n-gram lookup, `draft` -> the draft at `draft` (or the shipped default), or over
    `draft_model` when it is loaded already (the app keeps one per draft for every session); `draft_ngram` -> the
    n-gram's proposal where its match has `ngram_min_match` tokens, else the draft's."""
    if method == "baseline":
        return None
    if method == "ngram":
        return NgramProposer(prompt_lookup_min, prompt_lookup_max)
    if method == "draft_ngram":
        inner = make_proposer("draft", target, draft=draft, draft_model=draft_model, **options)
        return DraftNgramProposer(inner, NgramProposer(prompt_lookup_min, prompt_lookup_max), ngram_min_match)
    if method == "draft" or is_algorithm(method):
        if draft_model is None:
            path = draft or default_draft(target.ref.name)
            if path is None:
                raise WorkbenchError("no draft given and no shipped draft for this target",
                                     hint="pass --draft DIR (a speculators-format draft folder)")
            draft_model = load_decoding_draft(path, target)
        return proposer_for(draft_model, **options)
    raise WorkbenchError(f"unknown method '{method}'", hint=f"choose one of {list(METHODS)}")
