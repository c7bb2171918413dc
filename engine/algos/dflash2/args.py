"""DFlash2's typed training arguments (names and defaults as speculators 0.9.0 trains DFlash2)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from engine.algos.dflash.args import DFlashBlockArgs


class DFlash2Args(DFlashBlockArgs):
    """How a DFlash2 drafter is shaped and trained: DFlash's random-anchor blocks over the full vocabulary, grouped
    dynamic convolutions in every layer, and a candidate selector trained with a K-way cross-entropy."""

    field_defaults: ClassVar[dict[str, Any]] = {**DFlashBlockArgs.field_defaults, "block_size": 8, "loss_fn": "kl"}
    groups: ClassVar[dict[str, list[str]]] = {
        "Draft architecture": ["num_layers", "block_size", "sliding_window", "block_causal", "mask_token_id",
                               "conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"],
        "Objective": ["max_anchors", "loss_fn", "dflash_decay_gamma", "selector_loss_alpha", "speculative_tokens"],
    }

    loss_fn: Literal["ce", "kl"] = Field("kl", description="Unary loss: forward KL to the target's distribution "
                                                           "(speculators' DFlash2 default; the selector then learns "
                                                           "the target's argmax), or cross-entropy on the data tokens.")
    conv_kernel_size: int = Field(2, ge=1, description="Taps of each grouped dynamic causal convolution (at most "
                                                       "block_size).")
    conv_group_size: int = Field(16, ge=1, description="Hidden channels sharing one dynamic kernel (must divide the "
                                                       "hidden size).")
    selector_rank: int = Field(256, ge=1, description="Rank r of the candidate selector: two [V, r] codebooks, so "
                                                      "2·V·r parameters.")
    selector_top_k: int = Field(16, ge=1, description="Unary candidates per slot the selector rescores.")
    selector_loss_alpha: float = Field(1.0, ge=0, description="Weight of the selector's K-way cross-entropy.")

    @model_validator(mode="after")
    def _kernel_fits_the_block(self) -> DFlash2Args:
        if self.conv_kernel_size > self.block_size:
            raise ValueError(f"conv_kernel_size {self.conv_kernel_size} exceeds block_size {self.block_size}: a tap "
                             "reaches past the block's first slot; use at most block_size taps")
        return self
