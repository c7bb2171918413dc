"""What one target forward over n new tokens costs in-process: fp32, bf16 with transformers' own kernels, and bf16
with the workbench's routed decode kernels (engine.generate.cpu_kernels), interleaved in one run.

A speculative step with k drafts verifies k + 1 tokens in one forward; the speedup is bounded by the acceptance
length over that forward's cost in units of a one-token step. Each variant is timed after the same prompt
(a KV cache of `--context` tokens), repeats interleaved round-robin so all three see the same machine load.
The routed forward is also checked to equal the one-token steps it replaces, bit for bit.

    .venv/bin/python benchmarks/bench_step_cost.py --json benchmarks/results/step_cost/builtin.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)

VARIANTS = ("fp32", "bf16 (transformers kernels)", "bf16 (routed)")


def _runners(target: str | None):
    from engine.generate.runner import TargetRunner
    from engine.targets import load_target

    return {
        VARIANTS[0]: TargetRunner(load_target(target, dtype="fp32")),
        VARIANTS[1]: TargetRunner(load_target(target, dtype="bf16"), route_kernels=False),
        VARIANTS[2]: TargetRunner(load_target(target, dtype="bf16")),
    }


def _time_forward(runner, context: list[int], new: list[int]) -> float:
    runner.crop(len(context))
    t = time.perf_counter()
    runner.forward(new)
    return time.perf_counter() - t


def measure(target: str | None, *, context: int, ns: list[int], repeats: int) -> dict[str, Any]:
    """Median ms per forward of n new tokens for each variant, and each relative to its own one-token step and to
    fp32's."""
    import torch
    from tqdm import tqdm

    from engine.cpu import describe

    runners = _runners(target)
    prompt = [100 + (i * 37) % 20000 for i in range(context)]
    for r in runners.values():
        r.reset()
        r.forward(prompt, all_logits=False)
    samples: dict[str, dict[int, list[float]]] = {v: {n: [] for n in ns} for v in runners}
    for _ in tqdm(range(repeats), desc="step cost"):
        for n in ns:
            new = [500 + j for j in range(n)]
            for name, r in runners.items():
                samples[name][n].append(_time_forward(r, prompt, new))
    ms = {v: {n: 1e3 * statistics.median(s) for n, s in by_n.items()} for v, by_n in samples.items()}
    one_fp32 = ms[VARIANTS[0]][1]
    routed = runners[VARIANTS[2]]
    return {
        "context": context, "repeats": repeats, "threads": torch.get_num_threads(),
        "routed_is_active": bool(routed.routed), "ms": ms,
        "relative_to_own_step": {v: {n: m / by_n[1] for n, m in by_n.items()} for v, by_n in ms.items()},
        "relative_to_fp32_step": {v: {n: m / one_fp32 for n, m in by_n.items()} for v, by_n in ms.items()},
        "routed_rows_equal_steps": _rows_equal_steps(routed, prompt, [500, 501, 502, 503]),
        "routed_rows_equal_steps_by_rows": {n: _rows_equal_steps(routed, prompt, [500 + j for j in range(n)])
                                            for n in (2, 3, 5, 8, 16, 32)},
        "fp32_rows_equal_steps_by_rows": {n: _rows_equal_steps(runners[VARIANTS[0]], prompt,
                                                               [500 + j for j in range(n)]) for n in (2, 4, 8)},
        "routed_step_equals_transformers_step": _same_step(routed, runners[VARIANTS[1]], prompt, 500),
        "cpu": describe(), "torch": torch.__version__,
    }


def _same_step(a, b, prompt: list[int], token: int) -> bool:
    """Two runners' one-token logits after the same prompt, bit for bit (routed vs transformers' own bf16)."""
    import torch

    a.crop(len(prompt))
    b.crop(len(prompt))
    same = bool(torch.equal(a.forward([token])[0], b.forward([token])[0]))
    a.crop(len(prompt))
    b.crop(len(prompt))
    return same


def _rows_equal_steps(runner, prompt: list[int], new: list[int]) -> bool:
    """A forward over `new` gives the same logits, bit for bit, as len(new) one-token forwards."""
    import torch

    runner.crop(len(prompt))
    block, _ = runner.forward(new)
    runner.crop(len(prompt))
    steps = torch.cat([runner.forward([t])[0] for t in new])
    runner.crop(len(prompt))
    return bool(torch.equal(block, steps))


def markdown(result: dict[str, Any]) -> str:
    """The table of ms per forward; `result` as measured or as read back from its JSON (string keys)."""
    ns = sorted(next(iter(result["ms"].values())), key=int)
    lines = ["| target | " + " | ".join(f"{n} token{'s' if int(n) > 1 else ''}" for n in ns) + " |",
             "|---|" + "---|" * len(ns)]
    for v, by_n in result["ms"].items():
        own, fp = result["relative_to_own_step"][v], result["relative_to_fp32_step"][v]
        lines.append(f"| {v} | " + " | ".join(
            f"{by_n[n]:.1f} ms ({own[n]:.2f}× own, {fp[n]:.2f}× fp32)" for n in ns) + " |")
    yes = {True: "yes", False: "NO"}
    lines.append(f"\nKV cache of {result['context']} tokens, median of {result['repeats']} interleaved repeats, "
                 f"{result['threads']} threads{', ' + result['cpu'] if result.get('cpu') else ''}. Routed 4-token "
                 f"forward equals its 4 one-token steps bit for bit: {yes[result['routed_rows_equal_steps']]}.")
    if "routed_rows_equal_steps_by_rows" in result:
        by_rows = ", ".join(f"{n}: {yes[v]}" for n, v in result["routed_rows_equal_steps_by_rows"].items())
        lines.append(f"Same, by rows in one forward: {by_rows}. Routed one-token step equals transformers' own bf16 "
                     f"step bit for bit: {yes[result['routed_step_equals_transformers_step']]}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--context", type=int, default=300, help="tokens already in the KV cache")
    ap.add_argument("--ns", default="1,2,4,6,8", help="new tokens per forward (k + 1 for k drafts)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = measure(args.target, context=args.context, ns=[int(n) for n in args.ns.split(",")],
                     repeats=args.repeats)
    result["command"] = command_line("bench_step_cost.py", argv)
    print_and_save(result, markdown(result), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
