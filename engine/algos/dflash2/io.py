"""Build a fresh DFlash2 draft for a target, and load/save DFlash2 checkpoints in the speculators layout (through
DFlash's builder and loader, which serve the whole DFlash family)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine.algos.dflash.io import FamilyMember, build_dflash, load_dflash, save_dflash
from engine.algos.dflash2.args import DFlash2Args
from engine.algos.dflash2.model import DFlash2Draft
from engine.errors import WorkbenchError


def build_dflash2(target, args: DFlash2Args | None = None, **backbone: Any) -> DFlash2Draft:
    """A new DFlash2 draft: DFlash's backbone over the full vocabulary (`backbone`: aux_layer_ids, token_counts,
    seed), identity convolutions and a random selector, as `args` shape them."""
    a = args or DFlash2Args()
    if target.hidden_size % a.conv_group_size:
        raise WorkbenchError(f"conv_group_size {a.conv_group_size} does not divide the target's hidden size "
                             f"{target.hidden_size}", hint="choose a divisor of the hidden size, e.g. 16")
    fields = {"sample_from_anchor": False, "conv_kernel_size": a.conv_kernel_size,
              "conv_group_size": a.conv_group_size, "selector_rank": a.selector_rank,
              "selector_top_k": a.selector_top_k}
    draft = build_dflash(target, a, member=FamilyMember("dflash2", DFlash2Draft, fields), **backbone)
    draft.reset_convolutions()  # the random matrices of speculators' initialisation, then identity convolutions
    return draft


def load_dflash2(path: str | os.PathLike, target, *, allow_pickle: bool = False,
                 dtype: torch.dtype = torch.float32) -> DFlash2Draft:
    return load_dflash(path, target, allow_pickle=allow_pickle, dtype=dtype, algorithm="dflash2",
                       draft_class=DFlash2Draft)


def save_dflash2(draft: DFlash2Draft, path: str | os.PathLike, *, dtype: torch.dtype | None = torch.bfloat16,
                 config_updates: dict[str, Any] | None = None) -> Path:
    return save_dflash(draft, path, dtype=dtype, config_updates=config_updates)
