"""Glue for the Train page: the command line of a config, where a run writes, and the runs to chart."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from engine import jobs as engine_jobs
from engine.fsutil import atomic_write_text
from engine.train.config import TrainConfig
from ui.cli import flags
from ui.forms import field_kind

GROUPS = {
    "What to train": ["algo", "target", "data", "online_dataset", "online_max_samples", "out", "init_from"],
    "Draft architecture": ["num_layers", "draft_arch", "draft_vocab_size", "aux_layer_ids", "norm_before_residual",
                           "norm_before_fc", "fc_norm", "norm_output", "train_lm_head", "sliding_window"],
    "Objective": ["ttt_steps", "ttt_step_loss_decay", "speculative_tokens"],
    "Optimisation": ["lr", "weight_decay", "betas", "warmup_steps", "scheduler", "min_lr_ratio", "epochs",
                     "max_steps", "tokens_per_batch", "max_length", "grad_accum", "clip_grad", "precision", "seed"],
    "Validation, logging, checkpoints, device": ["val_fraction", "val_every", "val_max_batches", "log_every",
                                                 "checkpoint_every", "keep_checkpoints", "device"],
}
# A run that finishes in about a minute on a CPU: to try the pipeline, not to get a useful draft.
SMOKE = {"online_dataset": "sharegpt", "online_max_samples": 24, "data": None, "max_steps": 12, "epochs": 1,
         "tokens_per_batch": 256, "max_length": 192, "warmup_steps": 2, "val_fraction": 0.2, "val_every": 4,
         "val_max_batches": 2, "log_every": 1, "checkpoint_every": 6}


def defaults() -> dict[str, Any]:
    return {name: info.get_default(call_default_factory=True) for name, info in TrainConfig.model_fields.items()
            if not info.is_required()}


def default_out(name: str) -> str:
    return str(engine_jobs.runs_dir() / "train" / name)


def new_run_name() -> str:
    return "draft-" + time.strftime("%Y%m%d-%H%M%S")


def _flag_expressible(name: str) -> bool:
    return field_kind(TrainConfig.model_fields[name].annotation).kind != "tuple"


def train_argv(cfg: TrainConfig) -> tuple[list[str], dict[str, Any]]:
    """(argv for `python -m engine train`, fields that only a YAML file can carry) for a validated config.

    Fields equal to their default are left out. Fields argparse cannot take (tuples such as `betas`) go into a
    small YAML file that the command names with --config.
    """
    values = cfg.model_dump()
    dflt = defaults()
    changed = {k: v for k, v in values.items() if k not in dflt or dflt[k] != v}
    as_flags = {k: v for k, v in changed.items() if _flag_expressible(k)}
    in_yaml = {k: list(v) if isinstance(v, tuple) else v for k, v in changed.items() if not _flag_expressible(k)}
    return ["train", *flags(as_flags)], in_yaml


def write_yaml_overrides(out: str, values: dict[str, Any]) -> str:
    path = Path(out) / "train_overrides.yaml"
    atomic_write_text(path, yaml.safe_dump({"train": values}, sort_keys=False))
    return str(path)


def train_out(job: engine_jobs.Job) -> Path:
    """The folder a train job writes (checkpoints/, metrics.jsonl, draft/)."""
    from ui.jobs import argv_value

    out = argv_value(job, "--out")
    if out is None:
        config = argv_value(job, "--config")
        if config:
            try:
                raw = yaml.safe_load(Path(config).read_text()) or {}
                out = (raw.get("train", raw) or {}).get("out")
            except (OSError, yaml.YAMLError):
                out = None
    return Path(out or TrainConfig.model_fields["out"].default).expanduser()


def latest_checkpoint(out: Path) -> str | None:
    pointer = out / "checkpoints" / "latest"
    try:
        return pointer.read_text().strip() or None
    except OSError:
        return None


def metric_runs(max_depth: int = 4) -> dict[str, Path]:
    """Every folder under runs/ with a metrics.jsonl (train jobs, recipes), labelled by its path under runs/."""
    root = engine_jobs.runs_dir()
    found: dict[str, Path] = {}
    if not root.is_dir():
        return found
    for depth in range(1, max_depth + 1):
        for f in sorted(root.glob("/".join(["*"] * depth) + "/metrics.jsonl")):
            found[str(f.parent.relative_to(root))] = f.parent
    for job in engine_jobs.list_jobs(root):
        if job.kind == "train":
            out = train_out(job)
            if (out / "metrics.jsonl").is_file() and out not in found.values():
                found[str(out)] = out
    return found


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    return engine_jobs.read_jsonl(Path(folder) / "metrics.jsonl")


def last_row(rows: list[dict[str, Any]], split: str = "train") -> dict[str, Any] | None:
    return next((r for r in reversed(rows) if r.get("split") == split), None)


__all__ = [
    "GROUPS",
    "SMOKE",
    "TrainConfig",
    "default_out",
    "defaults",
    "last_row",
    "latest_checkpoint",
    "metric_runs",
    "new_run_name",
    "read_metrics",
    "train_argv",
    "train_out",
    "write_yaml_overrides",
]
