"""P-EAGLE's typed training arguments (names and defaults as speculators 0.9.0 builds P-EAGLE where it has them)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from engine.algos.base import DraftArgs
from engine.algos.peagle.config import SPECULATORS_NUM_DEPTHS


class PEagleArgs(DraftArgs):
    """How a P-EAGLE draft is shaped and trained (COD-sampled depths, forward KL to the target)."""

    field_defaults: ClassVar[dict[str, Any]] = {"num_layers": 4, "sliding_window": 2048}
    field_help: ClassVar[dict[str, str]] = {
        "num_layers": "Draft decoder layers: EAGLE-3's first layer (2H input) and num_layers - 1 standard ones "
                      "(speculators' P-EAGLE drafts: 4).",
        "speculative_tokens": "k written into the config (default: num_depths).",
    }
    groups: ClassVar[dict[str, list[str]]] = {
        "Draft architecture": ["num_layers", "draft_arch", "draft_vocab_size", "norm_before_residual",
                               "norm_before_fc", "fc_norm", "norm_output", "sliding_window", "mask_token_id",
                               "train_lm_head"],
        "Objective (COD sampling)": ["num_depths", "down_sample_ratio", "down_sample_ratio_min", "max_anchors",
                                     "speculative_tokens"],
    }

    draft_arch: Literal["llama", "qwen3"] = Field("qwen3", description="Draft layer type (speculators builds "
                                                                       "P-EAGLE with Qwen3 layers; vLLM: both).")
    norm_before_residual: bool = Field(False, description="First layer takes its residual after hidden_norm "
                                                          "(vLLM's default for P-EAGLE: off).")
    norm_before_fc: bool = Field(False, description="RMSNorm over the concatenated aux states before fc.")
    fc_norm: bool = Field(False, description="One RMSNorm per aux state before fc (exclusive with norm_before_fc).")
    norm_output: bool = Field(False, description="Post-norm hidden as the draft's output state (unused by one-pass "
                                                 "drafting; written for vLLM).")
    mask_token_id: int | None = Field(None, description="Token of the parallel slots, vLLM's pard_token (None: the "
                                                        "tokenizer's mask token, a spare embedding row, else "
                                                        "pad/unk/eos). Its embedding row is trained.")
    train_lm_head: bool = Field(False, description="Train the draft lm_head (speculators 0.9.0 keeps it frozen).")
    num_depths: int = Field(SPECULATORS_NUM_DEPTHS, ge=1,
                            description="Depths K trained per anchor: the real slot and K - 1 mask slots "
                                        "(K tokens drafted per forward).")
    down_sample_ratio: float = Field(0.7, gt=0, le=1, description="COD sampling: depth d keeps n * max(r^d, r_min) "
                                                                  "anchors (r = this ratio).")
    down_sample_ratio_min: float = Field(0.2, ge=0, le=1, description="COD sampling: the floor r_min of the kept "
                                                                      "share per depth.")
    max_anchors: int | None = Field(512, ge=1, description="Anchors n with mask slots per packed row, drawn at "
                                                           "random (None = every loss position).")

    @model_validator(mode="after")
    def _norms_exclusive(self):
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
        return self
