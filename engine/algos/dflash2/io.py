"""Build a fresh DFlash2 draft for a target, and load/save DFlash2 checkpoints in the speculators layout (through
DFlash's builder and loader, which serve the whole DFlash family)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine.algos.dflash.io import build_dflash, load_dflash, save_dflash
from engine.algos.dflash2.model import DFlash2Draft
from engine.errors import WorkbenchError


def build_dflash2(target, *, conv_kernel_size: int = 2, conv_group_size: int = 16, selector_rank: int = 256,
                  selector_top_k: int = 16, **backbone: Any) -> DFlash2Draft:
    """A new DFlash2 draft: DFlash's backbone over the full vocabulary (`backbone`: build_dflash's fields, block_size
    8 unless given), identity convolutions and a random selector."""
    backbone.setdefault("block_size", 8)
    if backbone.pop("draft_vocab_size", None) not in (None, target.vocab_size):
        raise WorkbenchError("DFlash2 drafts over the target's full vocabulary (its selector's codebooks are "
                             "[V, rank])", hint="drop --draft-vocab-size")
    if target.hidden_size % conv_group_size:
        raise WorkbenchError(f"conv_group_size {conv_group_size} does not divide the target's hidden size "
                             f"{target.hidden_size}", hint="choose a divisor of the hidden size, e.g. 16")
    if conv_kernel_size > backbone["block_size"]:
        raise WorkbenchError(f"conv_kernel_size {conv_kernel_size} exceeds block_size {backbone['block_size']}",
                             hint="use at most block_size taps")
    fields = {"sample_from_anchor": False, "conv_kernel_size": conv_kernel_size, "conv_group_size": conv_group_size,
              "selector_rank": selector_rank, "selector_top_k": selector_top_k}
    draft = build_dflash(target, draft_vocab_size=None, algorithm="dflash2", draft_class=DFlash2Draft,
                         config_fields=fields, **backbone)
    draft.reset_convolutions()  # the random matrices of speculators' initialisation, then identity convolutions
    return draft


def load_dflash2(path: str | os.PathLike, target, *, allow_pickle: bool = False,
                 dtype: torch.dtype = torch.float32) -> DFlash2Draft:
    return load_dflash(path, target, allow_pickle=allow_pickle, dtype=dtype, algorithm="dflash2",
                       draft_class=DFlash2Draft)


def save_dflash2(draft: DFlash2Draft, path: str | os.PathLike, *, dtype: torch.dtype | None = torch.bfloat16,
                 config_updates: dict[str, Any] | None = None) -> Path:
    return save_dflash(draft, path, dtype=dtype, config_updates=config_updates)
