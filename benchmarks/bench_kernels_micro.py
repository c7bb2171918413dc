"""Two kernel micro-benchmarks behind figures in BENCHMARKS.md: the fused forward KL against log_softmax + kl_div
(value and gradient, one [rows, vocab] batch), and bf16 linears through `F.linear` against a weight packed once
for oneDNN (the decode path's `packed-pad2` form), interleaved repeats, medians and spreads."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import command_line, print_and_save  # noqa: E402  (benchmarks/ is not a package)
from engine.algos.common.losses import forward_kl  # noqa: E402

LINEAR_SHAPES = [(1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576)]  # the built-in target's linears


def _time(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def kl_rows(rows: int, vocab: int, rounds: int) -> dict:
    """ms per forward + backward of each KL, `rounds` interleaved rounds."""
    def autograd_kl(z, p):
        return F.kl_div(F.log_softmax(z.float(), -1), p, reduction="none").sum(-1)

    times = {"log_softmax + kl_div": [], "fused forward_kl": []}
    weights = torch.rand(rows)
    for _ in range(rounds):
        for name, fn in (("log_softmax + kl_div", autograd_kl), ("fused forward_kl", forward_kl)):
            z = torch.randn(rows, vocab, requires_grad=True)
            p = torch.softmax(torch.randn(rows, vocab), -1)
            times[name].append(1000 * _time(lambda fn=fn, z=z, p=p: (fn(z, p) * weights).sum().backward(), 1))
    return {name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)} for name, v in times.items()}


def linears(rows: int, rounds: int) -> list[dict]:
    """µs per call of each linear shape: F.linear against the packed weight, and whether their outputs are equal."""
    out = []
    for n_out, n_in in LINEAR_SHAPES:
        w = (torch.randn(n_out, n_in) * 0.02).bfloat16()
        x = torch.randn(rows, n_in).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
        fns = {"F.linear": lambda w=w, x=x: F.linear(x, w),
               "packed": lambda p=packed, x=x: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")}
        repeats = 20 if n_out > 10_000 else 200
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                fn()
                times[name].append(1e6 * _time(fn, repeats))
        row = {"shape": [rows, n_in, n_out], "equal": bool(torch.equal(fns["F.linear"](), fns["packed"]()))}
        for name, v in times.items():
            row[f"{name}_us"] = statistics.median(v)
            row[f"{name}_spread_us"] = [min(v), max(v)]
        row["ratio"] = row["F.linear_us"] / row["packed_us"]
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", help="write the record here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    result = {"command": command_line("bench_kernels_micro.py", argv), "threads": args.threads,
              "kl": kl_rows(1024, 49152, args.rounds)}
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        result["linears"] = {str(r): linears(r, args.rounds) for r in (1, 2)}
    lines = ["| KL over [1024, 49152], forward + backward | median ms | spread |", "|---|---|---|"]
    lines += [f"| {k} | {v['median_ms']:.0f} | {v['min_ms']:.0f}–{v['max_ms']:.0f} |" for k, v in result["kl"].items()]
    if "linears" in result:
        lines += ["", "| bf16 linear [rows, in] × [in, out] | F.linear µs | packed µs | × | equal |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['F.linear_us']:.0f} | {r['packed_us']:.0f} | {r['ratio']:.2f} | {r['equal']} |"
                  for rows in result["linears"].values() for r in rows]
    print_and_save(result, "\n".join(lines), args.json, dtype="bf16 (linears), fp32 (KL)")


if __name__ == "__main__":
    main()
