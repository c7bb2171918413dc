"""The decoding speed memory bandwidth allows on this machine, beside the speed the engine reaches."""

# A decode step of a small dense target reads every weight once: tokens/s can be no higher than the memory bandwidth
# divided by the bytes of weights per token. The script measures the bandwidth torch reaches here (a read-only
# reduction and a copy over a buffer larger than the caches, `--threads` threads, best of `--repeats`), counts the
# built-in target's weight bytes in bf16 and fp32 (its tied embedding read once, by the head), and sets the limit
# beside the engine's measured baseline (`--achieved`: a bench record of the same machine, its baseline tokens/s).
#
#     .venv/bin/python benchmarks/bench_bandwidth.py --achieved \
#         benchmarks/results/reship-eagle3/amd-epyc-zen4-2026-12-04/sweep.json \
#         --json benchmarks/results/bandwidth/amd-epyc-zen4.json

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bandwidth(gib: float, repeats: int) -> dict[str, float]:
    """GB/s of a read-only sum and of a copy (read + write) over a `gib` GiB fp32 buffer, best of `repeats`."""
    import torch

    n = int(gib * 2**30) // 4
    a, b = torch.ones(n), torch.empty(n)
    b.copy_(a)  # pages touched before timing
    read, copy = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        read.append(n * 4 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        b.copy_(a)
        copy.append(2 * n * 4 / (time.perf_counter() - t) / 1e9)
    return {"read_gb_s": max(read), "copy_gb_s": max(copy)}


def weight_bytes(dtype_bytes: int) -> int:
    """The built-in target's parameters, each read once per token (tied embedding and head: one tensor)."""
    from engine.targets.loading import load_target

    target = load_target("smollm2-135m-instruct")
    seen, total = set(), 0
    for p in target.model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    return total * dtype_bytes


def table(result: dict) -> str:
    lines = ["| target dtype | weight bytes per token | limit at read bandwidth | engine baseline | share of the "
             "limit |", "|---|---|---|---|---|"]
    for row in result["rows"]:
        achieved = row.get("achieved_tokens_per_s")
        lines.append(f"| {row['dtype']} | {row['bytes'] / 1e6:.0f} MB | {row['limit_tokens_per_s']:.0f} tokens/s | "
                     + (f"{achieved:.1f} tokens/s | {achieved / row['limit_tokens_per_s']:.0%} |" if achieved
                        else "– | – |"))
    return "\n".join(lines + ["", f"Read {result['read_gb_s']:.1f} GB/s, copy {result['copy_gb_s']:.1f} GB/s "
                              f"({result['threads']} threads, {result['buffer_gib']} GiB buffer)."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="buffer size (GiB): larger than the caches")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--achieved", default=None, help="a bench record of this machine: its baseline tokens/s and "
                        "target dtype go beside the limit")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from benchmarks._results import command_line, print_and_save

    if args.threads:
        torch.set_num_threads(args.threads)
    bw = bandwidth(args.gib, args.repeats)
    achieved = json.loads(Path(args.achieved).read_text()) if args.achieved else {}
    base = ((achieved.get("methods") or {}).get("baseline") or {}).get("tokens_per_s")
    params = weight_bytes(1)
    rows = []
    for name, size in (("bf16", 2), ("fp32", 4)):
        row = {"dtype": name, "bytes": params * size, "limit_tokens_per_s": bw["read_gb_s"] * 1e9 / (params * size)}
        if base and achieved.get("target_dtype") == name:
            row["achieved_tokens_per_s"] = base
        rows.append(row)
    result = {"command": command_line("bench_bandwidth.py", argv), "dtypes": ["fp32"], **bw, "rows": rows,
              "parameters": params, "threads": torch.get_num_threads(), "buffer_gib": args.gib,
              "achieved_from": args.achieved}
    print_and_save(result, table(result), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
