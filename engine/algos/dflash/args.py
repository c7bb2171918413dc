"""DFlash's typed training arguments (names and defaults as speculators 0.9.0 where it has them)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from engine.algos.base import DecoderArgs, DraftArgs
from engine.algos.dflash.config import DFLASH_DEFAULT_LAYERS


class DFlashBlockArgs(DecoderArgs):
    """What the DFlash family's block drafters share: the block, its mask token, random anchors, the slot decay and
    the unary loss (DFlash and DFlash2 subclass it)."""

    field_defaults: ClassVar[dict[str, Any]] = {"num_layers": DFLASH_DEFAULT_LAYERS, "sliding_window": None}
    field_help: ClassVar[dict[str, str]] = {
        "num_layers": "Draft decoder layers (Qwen3 layers, as vLLM's DFlash loader builds).",
        "sliding_window": "Sliding window of every draft layer over the committed context (None = full attention).",
        "speculative_tokens": "k written into the config (default: block_size - 1).",
    }

    block_size: int = Field(16, ge=2, description="Tokens per block: the anchor plus block_size - 1 mask slots, so "
                                                  "block_size - 1 tokens drafted per forward.")
    block_causal: bool = Field(False, description="Slots attend causally inside a block (False = bidirectional, as "
                                                  "DFlash); written as sliding_window_non_causal so vLLM serves it.")
    mask_token_id: int | None = Field(None, description="Token filling the mask slots (None: the tokenizer's mask "
                                                        "token, a spare embedding row, else pad/unk/eos).")
    max_anchors: int = Field(512, ge=1, description="Anchors (blocks) sampled per packed row.")
    loss_fn: Literal["ce", "kl"] = Field("ce", description="Hard-label cross-entropy on the data tokens, or forward "
                                                           "KL to the target's distribution.")
    dflash_decay_gamma: float = Field(4.0, gt=0, description="Slot i of a block is weighted exp(-(i-1)/gamma).")


class DFlashArgs(DFlashBlockArgs, DraftArgs):
    """How a DFlash block drafter is shaped and trained (random anchors, one block per anchor)."""

    field_help: ClassVar[dict[str, str]] = {
        **DFlashBlockArgs.field_help,
        "draft_vocab_size": "Draft vocabulary: the most frequent loss-masked target tokens with its own lm_head "
                            "(None = the target's frozen lm_head over the full vocabulary).",
    }
    groups: ClassVar[dict[str, list[str]]] = {
        "Draft architecture": ["num_layers", "block_size", "draft_vocab_size", "sliding_window", "block_causal",
                               "mask_token_id"],
        "Objective": ["max_anchors", "loss_fn", "dflash_decay_gamma", "speculative_tokens"],
    }
