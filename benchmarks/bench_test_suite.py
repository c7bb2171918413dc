"""Time the test suite as CI runs it (`make test`'s pytest line) and record the summary and the slowest tests."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import command_line, print_and_save  # noqa: E402  (benchmarks/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"default": "not slow", "all": "slow or not slow"}  # the Makefile's `test` and `test-all` marks


def run_suite(marks: str, workers: int, slowest: int) -> dict:
    """Run pytest over the marks with `workers` xdist workers; its summary line, wall seconds and slowest tests."""
    xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers else []
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", marks, *xdist, f"--durations={slowest}", "-p",
           "no:cacheprovider"]
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout
    seconds = round(time.monotonic() - start, 1)
    lines = out.splitlines()
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "no summary")
    durations = [ln.strip() for ln in lines if re.match(r"\d+\.\d+s (call|setup|teardown) ", ln)]
    failed = [ln.split(" - ")[0] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return {"marks": marks, "workers": workers, "summary": summary, "seconds": seconds, "failed": failed,
            "slowest": durations}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", choices=sorted(SUITES), default="default")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (the Makefile's default: 2)")
    parser.add_argument("--slowest", type=int, default=20, help="how many of the slowest tests to keep")
    parser.add_argument("--json", help="write the record here (benchmarks/results/test_suite/<machine>.json)")
    args = parser.parse_args(argv)
    result = {"command": command_line("bench_test_suite.py", argv),
              args.suite: run_suite(SUITES[args.suite], args.workers, args.slowest)}
    run = result[args.suite]
    table = (f"| suite | workers | wall | summary |\n|---|---|---|---|\n"
             f"| {args.suite} | {args.workers} | {run['seconds'] / 60:.1f} min | {run['summary']} |")
    print_and_save(result, table, args.json, dtype="fp32")


if __name__ == "__main__":
    main()
