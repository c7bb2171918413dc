"""Training data plumbing shared by every algorithm: column layout, train/val split, token-budget batch plans.

A sample is a dict with `hidden_states` [T, L, H] (layer ids ascending; one column may be the target's
pre-norm last layer), `token_ids` [T] and `loss_mask` [T]. Turning samples into a batch (the input/label
shift) is each algorithm's own `collate`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.errors import WorkbenchError


class SampleSource(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]: ...


@dataclass
class Layout:
    """Which columns of `hidden_states` are aux features and which is the target's last layer."""

    aux_columns: list[int]
    last_column: int


def layout_for(layer_ids: Sequence[int], num_layers: int, aux_layer_ids: Sequence[int] | None,
               *, needs_last: bool = True) -> Layout:
    """Columns of the aux layers (default: every extracted layer but N) and of the last layer N (-1 if absent)."""
    ids = list(layer_ids)
    if needs_last and num_layers not in ids:
        raise WorkbenchError(f"the data has layers {ids} but not {num_layers} (the target's last layer, needed for "
                             "the training targets)", hint="re-extract without --layers (the algorithm's default "
                             "layers include the last one) or add it to --layers")
    aux = list(aux_layer_ids) if aux_layer_ids else [i for i in ids if i != num_layers]
    missing = [i for i in aux if i not in ids]
    if missing:
        raise WorkbenchError(f"aux layers {missing} were not extracted (the data has {ids})",
                             hint="choose aux layers among the extracted ones or re-extract")
    return Layout([ids.index(i) for i in sorted(aux)], ids.index(num_layers) if num_layers in ids else -1)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, val) split of range(n)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = int(round(n * val_fraction)) if val_fraction > 0 else 0
    if val_fraction > 0 and n > 1:
        n_val = max(1, n_val)
    return sorted(order[n_val:]), sorted(order[:n_val])


def plan_packed_batches(indices: Sequence[int], lengths: Sequence[int], budget: int, seed: int, epoch: int,
                 shuffle: bool = True) -> list[list[int]]:
    """Pack sample indices into micro-batches of at most `budget` tokens (order fixed by seed and epoch)."""
    order = list(indices)
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    batches: list[list[int]] = []
    used = budget + 1
    for i in order:
        n = min(lengths[i], budget)
        if used + n > budget:
            batches.append([])
            used = 0
        batches[-1].append(i)
        used += n
    return batches
