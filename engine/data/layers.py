"""Which target layer ids to capture (vLLM semantics: id k = input of decoder layer k, id N = last layer pre-norm)."""

from __future__ import annotations

from typing import Sequence

from engine.errors import WorkbenchError
from engine.targets import default_aux_layer_ids

# Algorithms whose drafts read [2, N//2, N-3] (EAGLE-3 and P-EAGLE share vLLM's default).
EAGLE_LIKE = ("eagle3", "peagle")
# Block drafters that read one evenly spaced target layer per draft layer (z-lab DFlash and its family).
DFLASH_LIKE = ("dflash", "dspark", "dflash2", "xpress")
ALGOS = EAGLE_LIKE + DFLASH_LIKE
DFLASH_DEFAULT_LAYERS = 5  # the z-lab / speculators trainer default number of draft layers


def evenly_spaced_layer_ids(num_layers: int, count: int = DFLASH_DEFAULT_LAYERS) -> list[int]:
    """`count` aux ids spread evenly over 2..N-2, the vLLM ids of z-lab DFlash's target layers.

    z-lab picks the outputs of decoder layers 1..N-3 (its `target_layer_ids`); the output of layer k is vLLM
    id k+1, so the aux ids run from 2 to N-2. Qwen3-8B (N=36) with 5 draft layers gives [2, 10, 18, 26, 34],
    the ids the speculators converter writes for z-lab's Qwen3-8B-DFlash-b16. One draft layer reads N//2.
    """
    if count < 1:
        raise WorkbenchError(f"cannot pick {count} layers", hint="use at least one layer")
    if count == 1:
        return [num_layers // 2 + 1]
    first, last = 2, max(2, num_layers - 2)
    ids = [first + int(i * (last - first) / (count - 1) + 0.5) for i in range(count)]  # round half up
    return sorted(set(min(max(i, 0), num_layers) for i in ids))


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
        algo = (algo or "eagle3").lower()
        if algo in EAGLE_LIKE:
            ids = default_aux_layer_ids(num_layers)
        elif algo in DFLASH_LIKE:
            ids = evenly_spaced_layer_ids(num_layers)
        else:
            raise WorkbenchError(f"unknown algorithm '{algo}'", hint=f"use one of {', '.join(ALGOS)} or --layers")
        if include_last:
            ids = sorted(set(ids) | {num_layers})
    bad = [i for i in ids if not 0 <= i <= num_layers]
    if bad:
        raise WorkbenchError(f"layer ids {bad} are outside 0..{num_layers} for this {num_layers}-layer target",
                             hint=f"use ids between 0 and {num_layers} ({num_layers} = last layer before the norm)")
    return ids
