"""Which target layer ids to capture (vLLM semantics: id k = input of decoder layer k, id N = last layer pre-norm)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import WorkbenchError


def layer_algorithms() -> list[str]:
    """The algorithms whose data `extract` prepares: the registry's list (`engine.algos.algorithm_names`)."""
    from engine.algos import algorithm_names

    return algorithm_names()


def default_layer_ids(num_layers: int, algo: str | None = None) -> list[int]:
    """The aux layer ids a draft of `algo` reads by default (the algorithm's own choice)."""
    from engine.algos import ALGOS, default_algo

    algo = (algo or default_algo()).lower()
    if algo in ALGOS:
        return ALGOS.get(algo).default_layer_ids(num_layers)
    raise WorkbenchError(f"unknown algorithm '{algo}'", hint=f"use one of {', '.join(layer_algorithms())} or --layers")


def parse_layer_ids(text: str | Sequence[int]) -> list[int]:
    """'2,15,27,30' -> [2, 15, 27, 30] (sorted, unique)."""
    if not isinstance(text, str):
        return sorted(set(int(i) for i in text))
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise WorkbenchError(f"bad layer ids '{text}'", hint="give comma-separated integers, e.g. 2,15,27,30") from None
    if not ids:
        raise WorkbenchError("no layer ids given", hint="give comma-separated integers, e.g. 2,15,27,30")
    return sorted(set(ids))


def resolve_layer_ids(num_layers: int, layers: str | Sequence[int] | None = None, algo: str | None = None,
                      *, include_last: bool = True) -> list[int]:
    """Explicit ids win; else the algorithm's default aux ids plus N (the pre-norm last layer) when `include_last`.

    The last id N is what drafts use for the target distribution (`verifier_last_hidden_states`).
    """
    if layers is not None and layers != "":
        ids = parse_layer_ids(layers)
    else:
        ids = default_layer_ids(num_layers, algo)
        if include_last:
            ids = sorted(set(ids) | {num_layers})
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if bad:
        raise WorkbenchError(f"layer ids {bad} are outside 0..{num_layers} for this {num_layers}-layer target",
                             hint=f"use ids between 0 and {num_layers} ({num_layers} = last layer before the norm)")
    return ids
