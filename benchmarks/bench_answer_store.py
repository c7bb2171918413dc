"""Benchmark re-evaluation through the answer store: the same draft and prompts evaluated twice, side by side."""

# The first `evaluate_draft` call has the target answer every held-out prompt (greedy decoding plus the draft's
# layers) and keeps the answers in `engine.measure.answers`; the second call reads them and only runs the draft pass.
# A private, empty store (a temporary $WORKBENCH_HOME with the built-in target's cache linked in) makes the first
# call a real first evaluation; the kernel path is decided (measured or read) before either call is timed. Records
# wall-clock seconds of both, their ratio, and whether every figure is equal.
#
#     .venv/bin/python benchmarks/bench_answer_store.py --prompts 12 --max-new-tokens 64 \
#         --json benchmarks/results/answer_store/amd-epyc-avx2.json

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)


def _private_home(real_home: Path) -> Path:
    """A workbench home without answers that shares the prepared built-in targets."""
    home = Path(tempfile.mkdtemp(prefix="answer-store-bench-"))
    for shared in ("targets",):
        if (real_home / shared).is_dir():
            (home / shared).symlink_to(real_home / shared, target_is_directory=True)
    return home


def _timed_evaluation(options: dict) -> tuple[float, dict]:
    from engine.measure.evaluate import evaluate_draft
    from engine.measure.options import EvaluateOptions

    start = time.perf_counter()
    result = evaluate_draft(EvaluateOptions(**options), progress=False)
    return time.perf_counter() - start, result


def _figures(result: dict) -> dict:
    return {k: (row["mean_acceptance_length"], row["per_position_acceptance"]) for k, row in result["by_k"].items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=12, help="held-out ShareGPT prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from engine.cpu import cpu_model
    from engine.fsutil import workbench_home

    real_home = workbench_home()
    os.environ["WORKBENCH_HOME"] = str(_private_home(real_home))
    options = dict(dataset="sharegpt", num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                   k=[1, 2, 3, 4, 5], dtype=args.dtype)
    from engine.generate.kernel_choice import load_decode_target

    load_decode_target(None, args.dtype)  # the kernel decision, cached before anything is timed
    first_s, first = _timed_evaluation(options)
    second_s, second = _timed_evaluation(options)
    equal = _figures(first) == _figures(second)
    result = {"command": command_line("bench_answer_store.py", argv), "cpu": cpu_model(), "dtype": args.dtype,
              "target_dtype": first.get("target_dtype"), "kernel": first.get("kernel"), "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "first_s": first_s, "second_s": second_s,
              "speedup": first_s / second_s, "figures_equal": equal,
              "mean_acceptance_length_k3": first["by_k"]["3"]["mean_acceptance_length"]}
    table = ("| evaluation | seconds |\n|---|---|\n"
             f"| first (target answers {args.prompts} prompts) | {first_s:.1f} |\n"
             f"| second (answers read from the store) | {second_s:.1f} |\n\n"
             f"Re-evaluation {first_s / second_s:.1f}x faster; every figure equal: {'yes' if equal else 'NO'}; "
             f"{cpu_model()}, target {first.get('target_dtype')}.")
    print_and_save(result, table, args.json)
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
