"""`train`: train a draft from a YAML recipe and/or flags; prints the checkpoint and its `vllm serve` line."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.cli import add_model_fields
    from engine.train.config import TrainConfig

    p.add_argument("--config", help="YAML recipe (a `train:` block or top-level fields); flags override it")
    add_model_fields(p, TrainConfig)


def run(args: argparse.Namespace) -> int:
    from engine.cli import model_overrides
    from engine.format.validate import validate_draft
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer

    overrides = model_overrides(args, TrainConfig)
    cfg = TrainConfig.from_yaml(args.config, **overrides) if args.config else TrainConfig(**overrides)
    trainer = Trainer(cfg)
    final = trainer.run()
    if trainer.d.main:
        report = validate_draft(final)
        print(f"draft: {final}")
        print(f"checkpoints: {trainer.checkpoint_dir()}")
        print(f"validate: {'OK' if report.ok else 'INVALID'}")
        for cmd in report.serve_commands:
            print(f"  $ {cmd}")
    return 0
