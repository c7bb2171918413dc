"""Tiny EAGLE-3 training runs for the tests: extracted data, a small TrainConfig, the metrics it wrote."""

from __future__ import annotations

import json
from pathlib import Path

from engine.data.options import ExtractOptions
from engine.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def extract(target_dir: Path, out: Path, n: int = 24, max_length: int = 160) -> Path:
    """n ShareGPT conversations of the target, extracted in fp32 for EAGLE-3 into `out`."""
    from engine.data.extract.dataset import extract_dataset

    extract_dataset(ExtractOptions(target=str(target_dir), dataset="sharegpt", out=out, algo="eagle3", max_samples=n,
                                   max_length=max_length, dtype="fp32"), progress=False)
    return out


def config(target, data, out, **kw) -> TrainConfig:
    """A small, fast TrainConfig (20% held out), any field overridden by `kw`."""
    base = dict(target=str(target), data=str(data), out=str(out), tokens_per_batch=256, max_length=160,
                draft_vocab_size=128, warmup_steps=2, lr=3e-3, val_every=1000, checkpoint_every=1000,
                val_fraction=0.2, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def read_metrics(out: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_online(algo: str, target_dir, out: Path, *, epochs: int, **algo_args) -> tuple[Path, list[dict]]:
    """A tiny run of `algo` on 16 ShareGPT conversations extracted on the fly (a quarter held out, validated every
    `epochs` steps): its final draft folder and its validation rows."""
    from engine.train.trainer import Trainer

    cfg = TrainConfig(algo=algo, target=str(target_dir), online_dataset="sharegpt", online_max_samples=16,
                      out=str(out), tokens_per_batch=384, max_length=128, epochs=epochs, warmup_steps=2, lr=3e-3,
                      val_fraction=0.25, val_every=epochs, checkpoint_every=1000, algo_args=algo_args)
    final = Trainer(cfg).run()
    return final, [r for r in read_metrics(out) if r["split"] == "val"]
