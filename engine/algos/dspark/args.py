"""DSpark's typed training arguments and proposer options (names and defaults as speculators 0.9.0 and the
DSpark paper where they have them)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.algos.base import DraftArgs
from engine.algos.dflash.config import DFLASH_DEFAULT_LAYERS


class DSparkArgs(DraftArgs):
    """How a DSpark drafter is shaped and trained: DFlash's random-anchor blocks, the anchor predicting too, a
    Markov correction head and a confidence head, loss = ce * CE + tv * TV + conf * BCE."""

    field_defaults: ClassVar[dict[str, Any]] = {"num_layers": DFLASH_DEFAULT_LAYERS, "sliding_window": None}
    field_help: ClassVar[dict[str, str]] = {
        "num_layers": "Draft decoder layers (Qwen3 or Gemma 4 layers, as --draft-layout says).",
        "draft_vocab_size": "Draft vocabulary: the most frequent loss-masked target tokens with its own lm_head "
                            "(None = the target's frozen lm_head over the full vocabulary).",
        "sliding_window": "Sliding window of every draft layer over the committed context (None = full attention).",
        "speculative_tokens": "k written into the config (default: block_size).",
    }
    groups: ClassVar[dict[str, list[str]]] = {
        "Draft architecture": ["draft_layout", "num_layers", "block_size", "draft_vocab_size", "sliding_window",
                               "block_causal", "mask_token_id", "markov_rank", "markov_head_type",
                               "enable_confidence_head", "confidence_head_with_markov"],
        "Objective": ["max_anchors", "dflash_decay_gamma", "ce_alpha", "tv_alpha", "confidence_head_alpha",
                      "speculative_tokens"],
        "Calibration": ["calibration_blocks"],
    }

    draft_layout: Literal["auto", "qwen3", "gemma4"] = Field(
        "auto", description="Layer layout of the vLLM class that serves the draft: qwen3 (Qwen3DSparkModel, the "
                            "speculators form) or gemma4 (Gemma4DSparkModel, vLLM's class beside Gemma 4 targets; "
                            "full vocabulary, no sliding window, its own form); auto = gemma4 for a Gemma 4 "
                            "target when the other arguments allow it.")
    block_size: int = Field(8, ge=1, description="Tokens per block: the anchor plus block_size - 1 mask slots; every "
                                                 "slot drafts, so block_size tokens per forward.")
    block_causal: bool = Field(False, description="Slots attend causally inside a block (False = bidirectional); "
                                                  "written as sliding_window_non_causal so vLLM serves it.")
    mask_token_id: int | None = Field(None, description="Token filling the mask slots (None: the tokenizer's mask "
                                                        "token, a spare embedding row, else pad/unk/eos).")
    markov_rank: int = Field(256, ge=0, description="Rank r of the Markov head W1[x_prev] W2 (0 = no sequential "
                                                    "head: plain parallel drafting).")
    markov_head_type: Literal["vanilla", "gated", "rnn"] = Field(
        "vanilla", description="Sequential head: vanilla (first-order Markov bias), gated (gated by the slot's "
                               "hidden state) or rnn (a recurrent state over the block). vLLM runs vanilla.")
    enable_confidence_head: bool = Field(True, description="Train the confidence head that estimates each slot's "
                                                           "survival and cuts the block.")
    confidence_head_with_markov: bool = Field(True, description="The confidence head also sees W1[x_prev] "
                                                                "(needs markov_rank > 0).")
    max_anchors: int = Field(512, ge=1, description="Anchors (blocks) sampled per packed row.")
    dflash_decay_gamma: float = Field(4.0, gt=0, description="Slot k (0-based) of a block is weighted "
                                                             "exp(-k/gamma).")
    ce_alpha: float = Field(0.1, ge=0, description="Weight of the cross-entropy on the data tokens.")
    tv_alpha: float = Field(0.9, ge=0, description="Weight of the total variation to the target's distribution "
                                                   "(1 - acceptance rate).")
    confidence_head_alpha: float = Field(1.0, ge=0, description="Weight of the confidence head's BCE against the "
                                                                "acceptance rate 1 - TV.")
    calibration_blocks: int = Field(4096, ge=0, description="Held-out blocks used after training to fit the "
                                                            "per-slot confidence temperatures (0 = no calibration).")


def resolved_layout(args: DSparkArgs, target_model_type: str | None, vocab_size: int) -> str:
    """'auto' -> gemma4 beside a Gemma 4 target (model_type gemma4*) unless the arguments need Qwen3 layers (a draft
    vocabulary, a sliding window: vLLM's Gemma 4 class has neither), else qwen3; an explicit layout is kept."""
    if args.draft_layout != "auto":
        return args.draft_layout
    fits = args.draft_vocab_size in (None, vocab_size) and not args.sliding_window
    return "gemma4" if fits and (target_model_type or "").startswith("gemma4") else "qwen3"


class DSparkProposerOptions(BaseModel):
    """How a DSpark draft drafts in the decode engine."""

    model_config = ConfigDict(extra="forbid")

    confidence_threshold: float = Field(
        0.2, ge=0, le=1, description="Static cut: verify only the drafted prefix whose survival probability "
                                     "(the product of the calibrated confidences) stays at or above this value "
                                     "(0 = verify every drafted token).")
    sample_drafts: bool = Field(True, description="At temperature > 0 sample the drafts from the corrected draft "
                                                  "distribution (False: greedy drafts, one-hot q).")
