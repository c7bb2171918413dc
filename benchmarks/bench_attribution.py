"""Why acceptance figures of one draft differ: τ at k = 3 under one protocol, then with one factor changed at a time."""

# The shipped EAGLE-3 draft of the built-in target is evaluated (`engine.measure.evaluate`, the decoding-exact walk)
# on a base protocol: ShareGPT's held-out prompts, 20 of them, 128 new tokens, the target in `--dtype`. Each other
# row changes one factor: the prompt set (HumanEval code), how many of the prompts (the first 10, as the card's
# checkpoint curve), answer length (64: the curve's; 256), prompt length (only prompts of at most 300 characters),
# the target's dtype. Position in the answer comes from the base run's buckets. Each row carries τ with its 95%
# bootstrap interval over prompts and its change against the base.
#
#     .venv/bin/python benchmarks/bench_attribution.py --json benchmarks/results/attribution/<cpu-kind>.json

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K = 3
BASE = {"dataset": "sharegpt", "num_prompts": 20, "max_new_tokens": 128, "max_prompt_chars": 1500}
# factor -> (what changes, the options it changes)
VARIANTS = (
    ("prompt set", "HumanEval code prompts instead of ShareGPT chat", {"dataset": "humaneval"}),
    ("number of prompts", "the first 10 of the 20 prompts (the card's checkpoint curve)", {"num_prompts": 10}),
    ("answer length", "64 new tokens (the card's checkpoint curve)", {"max_new_tokens": 64}),
    ("answer length", "256 new tokens (the training answers' limit)", {"max_new_tokens": 256}),
    ("curve protocol", "10 prompts × 64 tokens: both of the curve's changes",
     {"num_prompts": 10, "max_new_tokens": 64}),
    ("prompt length", "only prompts of ≤ 300 characters", {"max_prompt_chars": 300}),
)


def _tau(result: dict[str, Any]) -> dict[str, Any]:
    """τ at K over the result's prompts, with its bootstrap interval (engine.measure.spread)."""
    from engine.measure.spread import acceptance_spread

    acc = result["by_k"][str(K)]
    spread = acceptance_spread(acc["per_sample_acceptance_length"], acc["per_sample_num_drafts"])
    return {"tau": acc["mean_acceptance_length"], "ci95": spread["ci95"], "prompts": spread["prompts"]}


def _evaluate(draft: str, dtype: str, **change: Any) -> dict[str, Any]:
    from engine.measure.evaluate import evaluate_draft
    from engine.measure.options import EvaluateOptions

    options = EvaluateOptions(draft=draft, k=[K], dtype=dtype, **{**BASE, **change})
    return evaluate_draft(options, progress=False)


def _row(factor: str, change: str, got: dict[str, Any], base: float | None) -> dict[str, Any]:
    delta = got["tau"] - base if base is not None and got["tau"] is not None else None
    return {"factor": factor, "change": change, **got, "delta": delta}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| factor | protocol | τ at k = 3 (95% interval) | change |", "|---|---|---|---|"]
    for r in rows:
        ci = f" ({r['ci95'][0]:.2f}–{r['ci95'][1]:.2f})" if r.get("ci95") else ""
        delta = "–" if r.get("delta") is None else f"{r['delta']:+.2f}"
        lines.append(f"| {r['factor']} | {r['change']} | {r['tau']:.3f}{ci} | {delta} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="auto", help="the target's dtype in the base protocol (auto: bf16 where "
                        "the CPU runs it natively); the dtype row uses the other one")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from benchmarks._results import command_line, print_and_save
    from engine.algos.shipped import default_draft
    from engine.generate.acceptance import bucket_label

    draft = str(default_draft("smollm2-135m-instruct"))
    base_result = _evaluate(draft, args.dtype)
    base_dtype = base_result["target_dtype"]
    base = _tau(base_result)
    rows = [_row("base", f"ShareGPT held-out, {BASE['num_prompts']} prompts × {BASE['max_new_tokens']} tokens, "
                 f"{base_dtype} target", base, None)]
    for factor, change, options in VARIANTS:
        rows.append(_row(factor, change, _tau(_evaluate(draft, args.dtype, **options)), base["tau"]))
        print(table(rows[-1:]), flush=True)
    other = "float32" if base_dtype == "bf16" else "bfloat16"
    got = _evaluate(draft, other)
    rows.append(_row("target dtype", f"{got['target_dtype']} target", _tau(got), base["tau"]))
    buckets = [b for b in base_result["by_k"][str(K)].get("by_answer_position", []) if b["num_drafts"]]
    for b in buckets:  # the base run's drafts by where in the answer they start
        rows.append(_row("position in the answer", f"drafts starting at answer positions {bucket_label(b)} "
                         f"({b['num_drafts']} drafts)", {"tau": b["mean_acceptance_length"], "ci95": None,
                                                          "prompts": None}, base["tau"]))
    result = {"command": command_line("bench_attribution.py", argv), "dtype": base_dtype, "k": K,
              "draft": draft, "base": BASE, "rows": rows}
    print_and_save(result, table(rows), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
