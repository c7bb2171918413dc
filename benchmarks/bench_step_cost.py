"""What one target forward over n new tokens costs in-process on each kernel path of
engine.generate.kernel_choice (fp32, bf16 with transformers' own kernels, bf16 routed in each form), interleaved in one
run, and whether each path's multi-row forwards equal its one-token steps bit for bit."""

# A speculative step with k drafts verifies k + 1 tokens in one forward; the speedup is bounded by the acceptance
# length over that forward's cost in units of a one-token step. Each path is timed after the same prompt (a KV cache of
# `--context` tokens), repeats interleaved round-robin so all paths see the same machine load. Paths that need native
# bf16 are skipped on a CPU that emulates it.
#
#     .venv/bin/python benchmarks/bench_step_cost.py --json benchmarks/results/step_cost/builtin.json

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

EXACT_ROWS = (2, 3, 4, 5, 8, 16, 32)  # rows per forward checked against their one-token steps


def _paths(names: str | None) -> list[str]:
    """The kernel paths to time: the named ones, else every path this CPU may decode on (fp32 first)."""
    from engine.cpu import native_bf16
    from engine.generate.kernel_choice import PATHS

    if names:
        unknown = sorted(set(names.split(",")) - set(PATHS))
        if unknown:
            raise SystemExit(f"error: unknown kernel path(s) {unknown}; choose from {', '.join(PATHS)}")
        return names.split(",")
    return [n for n, p in PATHS.items() if native_bf16() or not p.native_bf16_only]


def _runners(target: str | None, paths: list[str]):
    from engine.generate.kernel_choice import PATHS
    from engine.generate.runner import TargetRunner
    from engine.targets.loading import load_target

    runners = {}
    for name in paths:
        path = PATHS[name]
        loaded = load_target(target, dtype=path.dtype, with_tokenizer=False)
        path.prepare(loaded.model)
        runners[name] = TargetRunner(loaded, route_kernels=path.routed)
    return runners


def _time_forward(runner, context: list[int], new: list[int]) -> float:
    runner.crop(len(context))
    t = time.perf_counter()
    runner.forward(new)
    return time.perf_counter() - t


def measure(target: str | None, *, context: int, ns: list[int], repeats: int,
            paths: list[str]) -> dict[str, Any]:
    """Median ms per forward of n new tokens for each path, each relative to its own one-token step and to fp32's,
    and each path's row exactness by rows per forward."""
    import torch
    from tqdm import tqdm

    from engine.cpu import describe
    from engine.generate.kernel_choice import rows_equal_steps

    runners = _runners(target, paths)
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
    one_fp32 = ms["fp32"][1] if "fp32" in ms else None
    return {
        "context": context, "repeats": repeats, "threads": torch.get_num_threads(), "ms": ms,
        "relative_to_own_step": {v: {n: m / by_n[1] for n, m in by_n.items()} for v, by_n in ms.items()},
        "relative_to_fp32_step": ({v: {n: m / one_fp32 for n, m in by_n.items()} for v, by_n in ms.items()}
                                  if one_fp32 else {}),
        "rows_equal_steps_by_path": {name: {n: rows_equal_steps(r, len(prompt), [500 + j for j in range(n)])
                                            for n in EXACT_ROWS} for name, r in runners.items()},
        "cpu": describe(), "torch": torch.__version__,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table of ms per forward; `result` as measured or as read back from its JSON (string keys). Records made
    before the kernel paths (three variants, the routed one's exactness alone) print as they did."""
    ns = sorted(next(iter(result["ms"].values())), key=int)
    by_path = result.get("rows_equal_steps_by_path")
    yes = {True: "yes", False: "NO"}
    columns = " | ".join(f"{n} token{'s' if int(n) > 1 else ''}" for n in ns)
    lines = [f"| target | {columns} |" + (" multi-row forwards = one-token steps |" if by_path else ""),
             "|---|" + "---|" * (len(ns) + bool(by_path))]
    for v, by_n in result["ms"].items():
        own, fp = result["relative_to_own_step"][v], result["relative_to_fp32_step"].get(v)
        cells = [f"{by_n[n]:.1f} ms ({own[n]:.2f}× own" + (f", {fp[n]:.2f}× fp32)" if fp else ")") for n in ns]
        if by_path:
            exact = by_path[v]
            cells.append("yes (rows " + ", ".join(map(str, exact)) + ")" if all(exact.values()) else
                         "NO (rows " + ", ".join(str(n) for n, ok in exact.items() if not ok) + " differ)")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines.append(f"\nKV cache of {result['context']} tokens, median of {result['repeats']} interleaved repeats, "
                 f"{result['threads']} threads{', ' + result['cpu'] if result.get('cpu') else ''}."
                 + ("" if by_path else f" Routed 4-token forward equals its 4 one-token steps bit for bit: "
                                       f"{yes[result['routed_rows_equal_steps']]}."))
    if "routed_rows_equal_steps_by_rows" in result:
        rows = ", ".join(f"{n}: {yes[v]}" for n, v in result["routed_rows_equal_steps_by_rows"].items())
        lines.append(f"Same, by rows in one forward: {rows}. Routed one-token step equals transformers' own bf16 "
                     f"step bit for bit: {yes[result['routed_step_equals_transformers_step']]}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--context", type=int, default=300, help="tokens already in the KV cache")
    ap.add_argument("--ns", default="1,2,4,6,8", help="new tokens per forward (k + 1 for k drafts)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--paths", default=None, help="comma-separated kernel paths (default: every path this CPU may "
                    "decode on, from engine.generate.kernel_choice.PATHS)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = measure(args.target, context=args.context, ns=[int(n) for n in args.ns.split(",")],
                     repeats=args.repeats, paths=_paths(args.paths))
    result["command"] = command_line("bench_step_cost.py", argv)
    print_and_save(result, markdown(result), args.json, dtype=list(result["ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
