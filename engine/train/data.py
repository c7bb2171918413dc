"""Training batches: samples of target hidden states packed into one row with document masks.

A sample is a dict with `hidden_states` [T, L, H] (layer ids ascending; the last column is the
target's pre-norm last layer when `last_index` is set), `token_ids` [T] and `loss_mask` [T].
`collate` applies EAGLE-3's shift (x_{t+1}, g_t, y_{t+1}, l_{t+1}) per document and concatenates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


class SampleSource(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]: ...


@dataclass
class Layout:
    """Which columns of `hidden_states` are aux features and which is the target's last layer."""

    aux_columns: list[int]
    last_column: int


def layout_for(layer_ids: Sequence[int], num_layers: int, aux_layer_ids: Sequence[int] | None) -> Layout:
    ids = list(layer_ids)
    if num_layers not in ids:
        from engine.errors import WorkbenchError

        raise WorkbenchError(f"the data has layers {ids} but not {num_layers} (the target's last layer, needed for "
                             "the training targets)", hint="re-extract with --algo eagle3 (it adds the last layer)")
    aux = list(aux_layer_ids) if aux_layer_ids else [i for i in ids if i != num_layers]
    missing = [i for i in aux if i not in ids]
    if missing:
        from engine.errors import WorkbenchError

        raise WorkbenchError(f"aux layers {missing} were not extracted (the data has {ids})",
                             hint="choose aux layers among the extracted ones or re-extract")
    return Layout([ids.index(i) for i in sorted(aux)], ids.index(num_layers))


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, val) split of range(n)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = int(round(n * val_fraction)) if val_fraction > 0 else 0
    if val_fraction > 0 and n > 1:
        n_val = max(1, n_val)
    return sorted(order[n_val:]), sorted(order[:n_val])


def plan_batches(indices: Sequence[int], lengths: Sequence[int], budget: int, seed: int, epoch: int,
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


def collate(samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int,
            dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Shift each sample and concatenate into one row [1, T]; keys: aux [1,T,A*H], verifier_last [1,T,H],
    input_ids, loss_mask, position_ids (1-based within a document), document_ids."""
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("aux", "last", "ids", "mask", "pos", "doc")}
    room = max_tokens
    for doc, s in enumerate(samples):
        t = min(int(s["token_ids"].shape[0]), room + 1)
        if t < 2:
            continue
        hs = s["hidden_states"][:t]                                        # [t, L, H]
        parts["aux"].append(hs[:-1, layout.aux_columns].flatten(1))        # g_0..g_{t-2}
        parts["last"].append(hs[1:, layout.last_column])                   # y_1..y_{t-1}
        parts["ids"].append(s["token_ids"][1:t].long())                    # x_1..x_{t-1}
        parts["mask"].append(s["loss_mask"][1:t].bool())                   # l_1..l_{t-1}
        parts["pos"].append(torch.arange(1, t))
        parts["doc"].append(torch.full((t - 1,), doc))
        room -= t - 1
        if room <= 0:
            break
    return {
        "aux": torch.cat(parts["aux"]).unsqueeze(0).to(dtype),
        "verifier_last": torch.cat(parts["last"]).unsqueeze(0).to(dtype),
        "input_ids": torch.cat(parts["ids"]).unsqueeze(0),
        "loss_mask": torch.cat(parts["mask"]).unsqueeze(0),
        "position_ids": torch.cat(parts["pos"]).unsqueeze(0),
        "document_ids": torch.cat(parts["doc"]).unsqueeze(0),
    }
