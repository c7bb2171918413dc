"""EAGLE-3's typed training arguments (descriptions are the CLI's and the Train form's help)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from engine.algos.base import DraftArgs
from engine.algos.eagle3.config import SPECULATORS_TTT_STEPS


class Eagle3Args(DraftArgs):
    """How an EAGLE-3 draft is shaped and trained (training-time test, forward KL to the target)."""

    field_defaults: ClassVar[dict[str, Any]] = {"num_layers": 1, "sliding_window": 2048}
    field_help: ClassVar[dict[str, str]] = {"speculative_tokens": "k written into the config (default: ttt_steps)."}
    groups: ClassVar[dict[str, list[str]]] = {
        "Draft architecture": ["num_layers", "draft_arch", "draft_vocab_size", "norm_before_residual",
                               "norm_before_fc", "fc_norm", "norm_output", "train_lm_head", "sliding_window",
                               "save_embeddings"],
        "Objective": ["ttt_steps", "ttt_step_loss_decay", "speculative_tokens"],
    }

    draft_arch: Literal["llama", "qwen3"] = Field("llama", description="Draft layer type (vLLM: llama or qwen3).")
    norm_before_residual: bool = Field(True, description="First layer takes its residual after hidden_norm.")
    norm_before_fc: bool = Field(True, description="RMSNorm over the concatenated aux states before fc.")
    fc_norm: bool = Field(False, description="One RMSNorm per aux state before fc (exclusive with norm_before_fc).")
    norm_output: bool = Field(True, description="Feed the post-norm hidden to the next step (Eagle 3.1).")
    train_lm_head: bool = Field(False, description="Train the draft lm_head (speculators 0.9.0 keeps it frozen).")
    save_embeddings: bool = Field(
        True, description="Write embed_tokens (a copy of the target's) into the draft, as speculators does. "
        "Off saves vocab x hidden values, but speculators 0.9.0 then fills the missing embed_tokens with random "
        "values (vLLM shares the target's), so the same draft drafts differently there.")
    ttt_steps: int = Field(SPECULATORS_TTT_STEPS, ge=1,
                           description="Training-time-test steps (draft tokens unrolled per position).")
    ttt_step_loss_decay: float = Field(1.0, gt=0, description="Weight of step k is decay**k.")

    @model_validator(mode="after")
    def _norms_exclusive(self):
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
        return self
