"""`train`: train a draft from a YAML recipe and/or flags; prints the checkpoint and its `vllm serve` line."""

from __future__ import annotations

import argparse
from typing import Any

from engine.algos import ALGOS, default_algo
from engine.commands.flags import add_model_fields, model_overrides
from engine.train.config import TrainConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML recipe (a `train:` block or top-level fields); flags override it")
    p.add_argument("--algo", choices=ALGOS.names(), default=None,
                   help=f"{TrainConfig.model_fields['algo'].description} (default: {default_algo()})")
    add_model_fields(p, TrainConfig, skip=("algo", "algo_args"), title="training (every algorithm)")
    seen: set[str] = set()
    shared = shared_defaults()
    for name in ALGOS.names():
        algo = ALGOS.get(name)
        add_model_fields(p, algo.args_class, skip=tuple(seen), title=f"{algo.title} arguments (--algo {name})",
                         defaults=shared)
        seen |= set(algo.args_class.model_fields)


def shared_defaults() -> dict[str, str]:
    """Help text for an argument several algorithms have with different defaults: "name1 16, name2 8"."""
    per_field: dict[str, dict[str, object]] = {}
    for name in ALGOS.names():
        for field, info in ALGOS.get(name).args_class.model_fields.items():
            per_field.setdefault(field, {})[name] = "none" if info.default is None else info.default
    return {field: ", ".join(f"{algo} {value}" for algo, value in by_algo.items())
            for field, by_algo in per_field.items() if len({repr(v) for v in by_algo.values()}) > 1}


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Every training field given on the command line (algorithm arguments flat; TrainConfig nests them)."""
    out = model_overrides(args, TrainConfig)
    for name in ALGOS.names():
        out.update(model_overrides(args, ALGOS.get(name).args_class))
    out.pop("algo_args", None)
    return out


def run(args: argparse.Namespace) -> int:
    from engine.format.validate import validate_draft
    from engine.train.trainer import Trainer

    overrides = train_overrides(args)
    cfg = TrainConfig.from_yaml(args.config, **overrides) if args.config else TrainConfig(**overrides)
    trainer = Trainer(cfg)
    final = trainer.run()
    if trainer.d.main:
        report = validate_draft(final)
        print(f"draft: {final}")
        print(f"checkpoints: {trainer.checkpoints.root}")
        print(f"validate: {'OK' if report.ok else 'INVALID'}")
        for cmd in report.serve_commands:
            print(f"  $ {cmd}")
    return 0
