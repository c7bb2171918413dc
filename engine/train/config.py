"""The typed training config: every field's description is its CLI help and its form help in the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, model_validator

from engine.algos import ALGOS, AlgoArgs, default_algo
from engine.errors import WorkbenchError


class TrainConfig(BaseModel):
    """How to train a draft: fields every algorithm shares, plus `algo_args` typed by the chosen algorithm.

    Precedence: command-line flag > YAML file > default. An algorithm argument may also be given at the top
    level (a flag, or a flat YAML key as older recipes wrote them): it is moved into `algo_args`.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # what
    algo: str = Field(default_factory=default_algo, description="Draft algorithm to train (a registered algorithm).")
    algo_args: SerializeAsAny[AlgoArgs] = Field(
        default_factory=AlgoArgs, description="The algorithm's own arguments (see its section of `--help`).")
    target: str | None = Field(
        None, description="Target (verifier): built-in name, local folder or hub id (default: the target the data "
                          "was extracted from, as its manifest records; online: the built-in).")
    data: str | None = Field(None, description="Folder of extracted hidden states (offline training).")
    online_dataset: str | None = Field(
        None, description="Dataset to run the target on inside the loop instead of extracted files (online training).")
    online_max_samples: int | None = Field(None, ge=1, description="Rows of the online dataset to use.")
    out: str = Field("runs/train", description="Output folder: checkpoints/, metrics.jsonl, the final draft.")
    init_from: str | None = Field(None, description="Start from an existing draft checkpoint (fine-tuning).")
    aux_layer_ids: list[int] | None = Field(
        None, description="Target layers the draft reads (default: the data's layers, else the algorithm's default).")

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
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto = fp32 on CPU, bf16 autocast on GPU; bf16 = bf16 autocast on either (weights and "
        "optimizer state stay fp32; on a CPU without native bf16 it is emulated and slow).")
    seed: int = Field(0, description="Seed for initialisation, shuffling and validation split.")

    # bookkeeping
    val_fraction: float = Field(0.05, ge=0, lt=1, description="Fraction of samples held out for validation.")
    val_every: int = Field(100, ge=1, description="Validate every N optimizer steps.")
    val_max_batches: int = Field(20, ge=1, description="Validation batches per evaluation.")
    log_every: int = Field(1, ge=1, description="Write a metrics.jsonl row every N steps.")
    checkpoint_every: int = Field(200, ge=1,
                                  description="Checkpoint every N optimizer steps (also at the end and on SIGTERM).")
    keep_checkpoints: int = Field(2, ge=1, description="Step checkpoints to keep (the final one is always kept).")
    device: str = Field("auto", description="auto, cpu or cuda.")

    # bad data and bad steps
    accept_target_change: bool = Field(
        False, description="Train although the target's weights are not those the data was extracted from (the "
                           "digests of their tensors differ); without it such data is refused.")
    bad_samples: Literal["refuse", "skip"] = Field(
        "refuse", description="A hidden-state file that fails the checks (shape, dtype, token id outside the "
                              "vocabulary, non-finite value): refuse = stop and name it; skip = leave it out and "
                              "report how many tokens were skipped.")
    max_nonfinite_steps: int = Field(
        5, ge=1, description="Steps in a row whose loss or gradients are not finite before the run stops (each is "
                             "skipped; the last good checkpoint is kept).")

    # several processes (under torchrun)
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="With several processes (torchrun): ddp = every rank holds the whole draft; fsdp = "
                           "FSDP2 shards the draft's layers, gradients and optimizer state over the ranks.")

    @model_validator(mode="before")
    @classmethod
    def _typed_algo_args(cls, data: Any) -> Any:
        """`algo_args` (a dict, or flat top-level keys) -> the chosen algorithm's typed arguments."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        algo = data.get("algo") or default_algo()
        if algo not in ALGOS:
            raise ValueError(f"unknown algorithm '{algo}': choose one of {ALGOS.names()}")
        args_class = ALGOS.get(algo).args_class
        nested = data.get("algo_args") or {}
        if isinstance(nested, BaseModel):
            nested = nested.model_dump()
        if not isinstance(nested, dict):
            raise ValueError(f"algo_args must be a mapping of {algo} arguments, got {type(nested).__name__}")
        flat = {k: data.pop(k) for k in list(data) if k not in cls.model_fields and k in args_class.model_fields}
        foreign = sorted(k for k in data if k not in cls.model_fields)
        for key in foreign:
            owners = [n for n in ALGOS.names() if key in ALGOS.get(n).args_class.model_fields]
            if owners:
                raise ValueError(f"'{key}' is an argument of {', '.join(owners)}, not of {algo}: drop it or choose "
                                 f"--algo {owners[0]}")
        try:
            data["algo_args"] = args_class.model_validate({**nested, **flat})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or algo}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"{algo} arguments: {problems}") from None
        return data

    @model_validator(mode="after")
    def _check(self):
        if self.data is None and self.online_dataset is None:
            raise ValueError("give `data` (extracted hidden states) or `online_dataset` (train online)")
        return self

    @property
    def algorithm(self):
        """The registered DraftAlgorithm of `algo`."""
        return ALGOS.get(self.algo)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Load a recipe; a `train:` block is used if present; `overrides` win."""
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise WorkbenchError(f"cannot read {path}: {exc}", hint="check the path and the YAML syntax") from exc
        raw = raw.get("train", raw)
        return cls.model_validate({**raw, **overrides})

    def to_yaml(self) -> str:
        return yaml.safe_dump({"train": self.model_dump(mode="json")}, sort_keys=False)
