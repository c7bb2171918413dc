"""Offline data loader vs trainer: can reading hidden states from disk keep the trainer fed?"""

# One run, the same data, the same batch plan, side by side:
#
# * open     `OfflineData(folder)`: the index the trainer builds at start (file list, lengths from the
#            safetensors headers, token counts); per sample, so it scales to a folder of any size.
# * loader   the trainer's own path for one micro-batch: read each sample file of the batch (safetensors),
#            the algorithm's `collate`, move to the device. Nothing is cached between batches.
# * trainer  the trainer's compute on the same batches already in memory: forward, backward, clip, AdamW step.
#
# The loader keeps up when its samples/s exceed the trainer's (ratio > 1): the trainer loads synchronously, so
# a loader at ratio r costs about 1/(1+r) of the step time. RSS is sampled before and after the loader pass,
# which drops each batch before reading the next, as the trainer does (streaming: RSS must not grow with the
# number of samples read).
#
# By default the script writes its own data: a tiny random target (tests/tiny.py, hidden size --hidden-size) and
# --samples synthetic samples of --tokens tokens with the algorithm's default layers (bf16 hidden states, the
# extractor's format), so the result does not depend on a download. With --data/--target it reads an existing
# extraction instead. The page cache is warm (files just written or read), i.e. the loader's best case on
# this disk; a cold read is bounded by the disk's bandwidth (bytes/s are printed).
#
#     .venv/bin/python benchmarks/bench_loader.py --samples 256 --tokens 512 --hidden-size 512 --batches 24 \
#         --threads 1 --json /tmp/bench_loader.json

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def synthetic_data(work: Path, *, samples: int, tokens: int, hidden: int, layers: int, algo: str, seed: int):
    """A tiny target of hidden size `hidden` and `samples` random samples in the extractor's format."""
    import torch

    from engine.algos import ALGOS
    from engine.data.store.files import FolderStats, write_manifest, write_sample
    from tiny import save_tiny_target

    target = save_tiny_target(work / "target", "llama", num_layers=layers, hidden_size=hidden)
    algorithm = ALGOS.get(algo)
    layer_ids = sorted(set(algorithm.default_layer_ids(layers)) | ({layers} if algorithm.needs_last_layer else set()))
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    vocab = 384
    stats = FolderStats(vocab)
    g = torch.Generator().manual_seed(seed)
    for i in range(samples):
        t = int(torch.randint(tokens // 2, tokens + 1, (1,), generator=g))
        ids = torch.randint(3, vocab, (t,), generator=g)
        mask = torch.ones(t, dtype=torch.int64)
        mask[: t // 4] = 0  # a prompt
        hs = torch.randn(t, len(layer_ids), hidden, generator=g).to(torch.bfloat16)
        write_sample(data, i, hs, ids, mask)
        stats.add(i, ids, mask)
    write_manifest(data, {"format": "vllm-hidden-states", "target": str(target), "layer_ids": layer_ids,
                          "num_layers": layers, "hidden_size": hidden, "dtype": "bf16", "vocab_size": vocab},
                   stats, complete=True)
    return target, data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="an existing extraction (default: write synthetic samples)")
    p.add_argument("--target", help="its target (with --data)")
    p.add_argument("--algo", default="eagle3")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--tokens", type=int, default=512, help="max tokens per synthetic sample (min is half)")
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--target-layers", type=int, default=8)
    p.add_argument("--tokens-per-batch", type=int, default=1024)
    p.add_argument("--batches", type=int, default=24, help="micro-batches measured on each side")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", help="folder for the synthetic data (default: a temp folder)")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from engine.train.config import TrainConfig
    from engine.train.trainer import OfflineData, Trainer

    tmp = tempfile.TemporaryDirectory(prefix="bench-loader-") if not args.work else None
    work = Path(args.work or tmp.name)
    if args.data:
        if not args.target:
            p.error("--data needs --target")
        target, data = args.target, Path(args.data)
    else:
        t0 = time.perf_counter()
        target, data = synthetic_data(work, samples=args.samples, tokens=args.tokens, hidden=args.hidden_size,
                                      layers=args.target_layers, algo=args.algo, seed=0)
        print(f"wrote {args.samples} synthetic samples in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    t0 = time.perf_counter()
    opened = OfflineData(str(data))
    open_s = time.perf_counter() - t0
    n = len(opened)
    del opened

    cfg = TrainConfig(target=str(target), data=str(data), algo=args.algo, out=str(work / "run"),
                      tokens_per_batch=args.tokens_per_batch, max_length=args.tokens_per_batch, val_fraction=0.0,
                      warmup_steps=0, device="cpu", seed=0)
    trainer = Trainer(cfg)
    plan = trainer.batches_for_epoch(0)[: args.batches]
    bytes_read = sum(os.path.getsize(trainer.data.dataset.folder / f"hs_{trainer.data.dataset.indices[i]}.safetensors")
                     for b in plan for i in b)

    rss0 = rss_mb()
    t0 = time.perf_counter()
    for b in plan:  # the loader, exactly as the trainer calls it; each batch dropped before the next
        batch = trainer._batch(b)
    del batch
    load_s = time.perf_counter() - t0
    rss1 = rss_mb()
    batches = [trainer._batch(b) for b in plan]  # the trainer side: the same batches, in memory
    held_mb = sum(v.numel() * v.element_size() for b in batches for v in b.values()) / 2**20

    trainer.draft.train()
    trainer._micro_step(batches[0])  # warm-up (allocations), not timed
    trainer.opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    for batch in batches:
        trainer._micro_step(batch)
        torch.nn.utils.clip_grad_norm_(trainer.draft.parameters(), cfg.clip_grad)
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)
    train_s = time.perf_counter() - t0

    samples = sum(len(b) for b in plan)
    tokens = sum(trainer.data.lengths[i] for b in plan for i in b)
    result = {
        "algo": args.algo, "samples_in_folder": n, "batches": len(plan), "samples": samples, "tokens": tokens,
        "hidden_size": trainer.verifier.hidden_size, "layers_per_sample": len(trainer.data.layer_ids),
        "tokens_per_batch": args.tokens_per_batch, "threads": args.threads,
        "open": {"seconds": open_s, "us_per_sample": 1e6 * open_s / max(1, n)},
        "loader": {"seconds": load_s, "samples_per_s": samples / load_s, "tokens_per_s": tokens / load_s,
                   "MB_per_s": bytes_read / 2**20 / load_s, "rss_growth_MB": rss1 - rss0,
                   "batches_held_MB": held_mb},
        "trainer": {"seconds": train_s, "samples_per_s": samples / train_s, "tokens_per_s": tokens / train_s},
        "loader_over_trainer": train_s / load_s,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}",
    }
    print(f"{'':8} {'samples/s':>10} {'tokens/s':>10}")
    print(f"{'loader':8} {result['loader']['samples_per_s']:10.1f} {result['loader']['tokens_per_s']:10.0f}   "
          f"({result['loader']['MB_per_s']:.0f} MB/s from files)")
    print(f"{'trainer':8} {result['trainer']['samples_per_s']:10.1f} {result['trainer']['tokens_per_s']:10.0f}")
    print(f"loader / trainer = {result['loader_over_trainer']:.1f}x; opening the folder: "
          f"{result['open']['us_per_sample']:.0f} us/sample ({n} samples); RSS growth while loading "
          f"{rss1 - rss0:.0f} MB (the {len(plan)} batches hold {held_mb:.0f} MB)")
    if args.json:
        from benchmarks._results import command_line
        from engine.provenance import provenance

        result.update(provenance("bf16", command=command_line("bench_loader.py", argv)))
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
