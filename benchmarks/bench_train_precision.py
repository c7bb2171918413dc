"""Benchmark training precision on a CPU: our EAGLE-3 trainer in fp32 against bf16 autocast, same data, same CPU."""

# Both runs train the same draft of the built-in SmolLM2-135M-Instruct on the same extracted ShareGPT hidden states
# (`engine train --precision fp32|bf16`, every other setting equal: EAGLE-3, 1 layer, seed 0, the registry's
# defaults), one after the other in fresh subprocesses with the same thread count. Per run the record keeps the
# trainer's own per-step tokens/s (its metrics.jsonl; the first --warmup steps dropped), the wall time of the whole
# run, its final validation loss and estimated acceptance, and the draft's decoding-exact acceptance per k from
# `engine evaluate` on held-out ShareGPT prompts (fp32 target, the same prompts for both drafts). bf16 autocast
# keeps weights and optimizer state in fp32; on a CPU without native bf16 it is emulated (the record names the CPU
# and whether it has AVX-512 BF16 or AMX).
#
# Throughput is also compared in --rounds short interleaved runs (ABBA: fp32, bf16, bf16, fp32, ...) of
# --round-steps steps each, since the machine is shared and one long run per side can meet a busy minute.
#
#     .venv/bin/python benchmarks/bench_train_precision.py --samples 200 --max-length 512 --max-steps 40 \
#         --tokens-per-batch 1024 --rounds 1 --round-steps 6 --eval-prompts 8 --eval-tokens 64 \
#         --json benchmarks/results/train_precision/amd-epyc-zen4.json

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)
from engine.cpu import cpu_model  # noqa: E402

PRECISIONS = ("fp32", "bf16")
ALGO = "eagle3"


def engine(argv: list[str], threads: int, timeout: float = 7200) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-m", "engine", *argv], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"`python -m engine {' '.join(argv)}` failed:\n{out.stderr[-3000:]}")
    return out


def cpu_bf16_flags() -> list[str]:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return []
    return sorted({f for f in flags if f in ("avx512_bf16", "amx_bf16")})


def train(a, data: Path, precision: str, out: Path, *, max_steps: int | None = None) -> dict:
    """One training run; its per-step throughput, wall time and final validation figures."""
    argv = ["train", "--data", str(data), "--algo", ALGO, "--precision", precision, "--epochs", str(a.epochs),
            "--tokens-per-batch", str(a.tokens_per_batch), "--seed", "0",
            "--out", str(out)]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    started = time.perf_counter()
    engine(argv, a.threads)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("split") == "train"]
    vals = [r for r in records if r.get("split") == "val"]
    speeds = [r["tokens_per_s"] for r in steps[a.warmup:] if r.get("tokens_per_s")]
    last = vals[-1] if vals else {}
    return {"precision": precision, "steps": len(steps), "wall_s": round(wall, 1),
            "tokens_per_s_median": round(statistics.median(speeds), 1) if speeds else None,
            "final_train_loss": steps[-1]["loss"] if steps else None,
            "val_loss": last.get("loss"), "val_est_acceptance_length": last.get("est_acceptance_length"),
            "val_walk_acceptance_length": last.get("walk_acceptance_length")}


def evaluate(a, draft: Path, out: Path) -> dict:
    engine(["evaluate", "--draft", str(draft), "--num-prompts", str(a.eval_prompts), "--max-new-tokens",
            str(a.eval_tokens), "--k", "1,2,3", "--dtype", "fp32", "--json", str(out)], a.threads)
    result = json.loads(out.read_text())
    return {str(k): round(v["mean_acceptance_length"], 4) for k, v in result["by_k"].items()}


def table(result: dict) -> str:
    lines = ["| precision | steps | tokens/s (median step) | wall s | val loss | val est. acceptance | "
             "τ k=1 | τ k=2 | τ k=3 |", "|---|---|---|---|---|---|---|---|---|"]
    for p in PRECISIONS:
        run, tau = result["full"][p], result["evaluate"][p]
        lines.append(f"| {p} | {run['steps']} | {run['tokens_per_s_median']} | {run['wall_s']} | "
                     f"{run['val_loss']:.3f} | {run['val_est_acceptance_length']:.3f} | "
                     f"{tau['1']:.3f} | {tau['2']:.3f} | {tau['3']:.3f} |")
    ratios = ", ".join(f"{r:.2f}×" for r in result["round_ratios"])
    lines.append("")
    flags = result["bf16_flags"] or "no native bf16"
    lines.append(f"bf16 / fp32 tokens/s: full runs {result['full_ratio']:.2f}×; interleaved rounds {ratios} "
                 f"(median {result['round_ratio_median']:.2f}×). CPU: {result['cpu']} ({flags})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="an extracted folder (EAGLE-3 layers of the built-in target); else extracted here")
    ap.add_argument("--work", help="working folder (default: a temporary one)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, help="stop each full run after this many steps (same for both)")
    ap.add_argument("--tokens-per-batch", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped from each run's throughput")
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds of short runs for the throughput ratio")
    ap.add_argument("--round-steps", type=int, default=8)
    ap.add_argument("--eval-prompts", type=int, default=10)
    ap.add_argument("--eval-tokens", type=int, default=96)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-train-precision-"))
    data = Path(a.data) if a.data else work / "extract"
    if not a.data:
        engine(["extract", "--dataset", "sharegpt", "--algo", ALGO, "--max-samples", str(a.samples),
                "--max-length", str(a.max_length), "--out", str(data)], a.threads)
    full = {p: train(a, data, p, work / f"full-{p}", max_steps=a.max_steps) for p in PRECISIONS}
    taus = {p: evaluate(a, work / f"full-{p}" / "draft", work / f"eval-{p}.json") for p in PRECISIONS}
    ratios = []
    for r in range(a.rounds):
        order = PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]
        speeds = {p: train(a, data, p, work / f"round{r}-{p}", max_steps=a.round_steps)["tokens_per_s_median"]
                  for p in order}
        ratios.append(speeds["bf16"] / speeds["fp32"])
    manifest = json.loads((data / "manifest.json").read_text())
    result = {"benchmark": "train_precision", "cpu": cpu_model(), "bf16_flags": cpu_bf16_flags(),
              "date": time.strftime("%Y-%m-%d"), "threads": a.threads, "algo": ALGO,
              "data": {"samples": manifest.get("samples"), "tokens": manifest.get("tokens"),
                       "max_length": manifest.get("max_length"), "target": manifest.get("target")},
              "settings": {k: getattr(a, k) for k in ("epochs", "max_steps", "tokens_per_batch", "warmup", "rounds",
                                                      "round_steps", "eval_prompts", "eval_tokens")},
              "full": full, "evaluate": taus,
              "full_ratio": full["bf16"]["tokens_per_s_median"] / full["fp32"]["tokens_per_s_median"],
              "round_ratios": ratios, "round_ratio_median": statistics.median(ratios),
              "command": command_line("bench_train_precision.py", argv)}
    print_and_save(result, table(result), a.json_out, dtype=list(PRECISIONS))


if __name__ == "__main__":
    main()
