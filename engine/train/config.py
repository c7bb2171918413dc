"""The typed training config: every field's description is its CLI help and its form help in the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.errors import WorkbenchError


class TrainConfig(BaseModel):
    """How to train a draft. Precedence: command-line flag > YAML file > default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # what
    algo: Literal["eagle3"] = Field("eagle3", description="Draft algorithm to train.")
    target: str = Field("smollm2-135m-instruct", description="Target (verifier): built-in name, local folder or hub id.")
    data: str | None = Field(None, description="Folder of extracted hidden states (offline training).")
    online_dataset: str | None = Field(
        None, description="Dataset to run the target on inside the loop instead of extracted files (online training).")
    online_max_samples: int | None = Field(None, ge=1, description="Rows of the online dataset to use.")
    out: str = Field("runs/train", description="Output folder: checkpoints/, metrics.jsonl, the final draft.")
    init_from: str | None = Field(None, description="Start from an existing draft checkpoint (fine-tuning).")

    # draft architecture
    num_layers: int = Field(1, ge=1, description="Draft decoder layers.")
    draft_arch: Literal["llama", "qwen3"] = Field("llama", description="Draft layer type (vLLM: llama or qwen3).")
    draft_vocab_size: int | None = Field(
        None, ge=1, description="Draft vocabulary: the most frequent loss-masked target tokens (None = full vocab).")
    aux_layer_ids: list[int] | None = Field(
        None, description="Target layers fused by fc (default: the data's aux layers, else [2, N//2, N-3]).")
    norm_before_residual: bool = Field(True, description="First layer takes its residual after hidden_norm.")
    norm_before_fc: bool = Field(True, description="RMSNorm over the concatenated aux states before fc.")
    fc_norm: bool = Field(False, description="One RMSNorm per aux state before fc (exclusive with norm_before_fc).")
    norm_output: bool = Field(True, description="Feed the post-norm hidden to the next step (Eagle 3.1).")
    train_lm_head: bool = Field(False, description="Train the draft lm_head (speculators 0.9.0 keeps it frozen).")
    sliding_window: int | None = Field(2048, description="Sliding window of the draft layers (None = full attention).")

    # objective
    ttt_steps: int = Field(3, ge=1, description="Training-time-test steps (draft tokens unrolled per position).")
    ttt_step_loss_decay: float = Field(1.0, gt=0, description="Weight of step k is decay**k.")
    speculative_tokens: int | None = Field(None, ge=1, description="k written into the config (default: ttt_steps).")

    # optimisation
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas.")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps.")
    scheduler: Literal["cosine", "linear", "constant"] = Field("cosine", description="Decay after warm-up.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of the peak.")
    epochs: int = Field(1, ge=1, description="Passes over the training data.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    tokens_per_batch: int = Field(2048, ge=16, description="Packed tokens per micro-batch (per process).")
    max_length: int = Field(2048, ge=8, description="Samples are truncated to this many tokens.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step.")
    clip_grad: float = Field(1.0, gt=0, description="Gradient norm clipping.")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto = fp32 on CPU, bf16 autocast on GPU.")
    seed: int = Field(0, description="Seed for initialisation, shuffling and validation split.")

    # bookkeeping
    val_fraction: float = Field(0.05, ge=0, lt=1, description="Fraction of samples held out for validation.")
    val_every: int = Field(100, ge=1, description="Validate every N optimizer steps.")
    val_max_batches: int = Field(20, ge=1, description="Validation batches per evaluation.")
    log_every: int = Field(1, ge=1, description="Write a metrics.jsonl row every N steps.")
    checkpoint_every: int = Field(200, ge=1, description="Checkpoint every N optimizer steps (also at the end and on SIGTERM).")
    keep_checkpoints: int = Field(2, ge=1, description="Step checkpoints to keep (the final one is always kept).")
    device: str = Field("auto", description="auto, cpu or cuda.")

    @model_validator(mode="after")
    def _check(self):
        if self.data is None and self.online_dataset is None:
            raise ValueError("give `data` (extracted hidden states) or `online_dataset` (train online)")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> "TrainConfig":
        """Load a recipe; a `train:` block is used if present; `overrides` win."""
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise WorkbenchError(f"cannot read {path}: {exc}", hint="check the path and the YAML syntax") from exc
        raw = raw.get("train", raw)
        return cls.model_validate({**raw, **overrides})

    def to_yaml(self) -> str:
        return yaml.safe_dump({"train": self.model_dump(mode="json")}, sort_keys=False)
