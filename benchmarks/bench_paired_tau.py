"""Is one draft's τ below another's, or within the noise of the held-out samples? A paired comparison of two
`evaluate` results on the same samples.

    python benchmarks/bench_paired_tau.py --ours EVAL.json --theirs EVAL.json [--k 3] [--json OUT]
"""

# Both files come from `python -m engine evaluate --data ... --json` over the same held-out samples (as
# `bench_train_quality.py` writes them: `eval-ours.json`, `eval-speculators.json`). Per sample, the difference of the
# two mean acceptance lengths at k; their mean with its 95% t interval. An interval that holds 0 means the held-out
# samples cannot tell the two apart. The record keeps both evaluations' per-sample values, commands and machines.

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, print_and_save  # noqa: E402


def side(path: Path, k: int) -> dict:
    """One evaluation's figures at k, per sample, and where it was measured."""
    ev = json.loads(path.read_text())
    at = ev["by_k"][str(k)]
    return {"file": str(path), "command": ev.get("command"), "cpu": ev.get("cpu"), "cpu_kind": ev.get("cpu_kind"),
            "dtype": ev.get("dtype"), "date": ev.get("date"), "draft": ev.get("draft"),
            "num_samples": ev["num_samples"],
            "tau": at["mean_acceptance_length"], "per_sample": at["per_sample_acceptance_length"],
            "per_sample_num_drafts": at.get("per_sample_num_drafts")}


def compare(ours: dict, theirs: dict) -> dict:
    """Per-sample differences (ours − theirs) of the mean acceptance length, their mean and 95% t interval."""
    from engine.measure.spread import mean_interval

    if len(ours["per_sample"]) != len(theirs["per_sample"]):
        raise SystemExit("the two evaluations hold different numbers of samples: not the same held-out set")
    diffs = [a - b for a, b in zip(ours["per_sample"], theirs["per_sample"], strict=True)]
    spread = mean_interval(diffs)
    lo, hi = spread["ci95"] or (None, None)
    verdict = ("within the noise (the interval holds 0)" if lo is not None and lo <= 0 <= hi
               else "ours higher" if lo is not None and lo > 0 else "ours lower" if hi is not None else "one sample")
    wins = sum(d > 0 for d in diffs), sum(d == 0 for d in diffs), sum(d < 0 for d in diffs)
    return {"difference": spread, "verdict": verdict, "samples_higher_equal_lower": list(wins)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", required=True, type=Path, help="our draft's evaluate JSON")
    p.add_argument("--theirs", required=True, type=Path, help="the reference draft's evaluate JSON")
    p.add_argument("--k", type=int, default=3, help="draft length compared (default 3)")
    p.add_argument("--json", help="write the record here")
    a = p.parse_args(argv)
    ours, theirs = side(a.ours, a.k), side(a.theirs, a.k)
    result = {"command": command_line("bench_paired_tau.py", argv), "k": a.k, "ours": ours, "theirs": theirs,
              **compare(ours, theirs)}
    d = result["difference"]
    lo, hi = d["ci95"] or (float("nan"), float("nan"))
    table = ("| k | samples | τ ours | τ theirs | mean per-sample difference (95% t) | higher / equal / lower | "
             "verdict |\n|---|---|---|---|---|---|---|\n"
             f"| {a.k} | {d['n']} | {ours['tau']:.3f} | {theirs['tau']:.3f} | {d['mean']:+.4f} ({lo:+.4f} to "
             f"{hi:+.4f}) | {' / '.join(map(str, result['samples_higher_equal_lower']))} | {result['verdict']} |")
    print_and_save(result, table, a.json, dtype=ours["dtype"] or "fp32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
