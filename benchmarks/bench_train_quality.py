"""Benchmark training outcome: the acceptance our trainer's drafts reach against speculators 0.9.0's, same samples."""

# For each algorithm both libraries train (EAGLE-3, DFlash, P-EAGLE, DSpark, DFlash2) the script trains one draft with
# `python -m engine train` and one with speculators 0.9.0's `speculators.train` on the same extracted samples of
# the built-in SmolLM2-135M-Instruct (its own regenerated answers), the same training rows in the same split, the
# same steps, learning rate, schedule, optimizer, batch tokens and draft shapes, then scores both drafts with the
# same evaluator (`python -m engine evaluate --data`: decoding-exact mean acceptance length per k on held-out
# answers the target regenerated, no target forward). It records tau per k, tokens per CPU-second and both
# loss curves.
#
# Settings each side is given explicitly (everything else is each library's default, which ours mirrors by name):
#   shapes      1 draft layer, draft vocabulary --draft-vocab-size (top loss-token counts), block size 8 and 128
#               anchors per row (DFlash, DSpark), 4 depths and 128 anchors (P-EAGLE), Markov rank 64 (DSpark);
#               DFlash2 drafts over the full vocabulary (both libraries require it), block size 8, 128 anchors,
#               convolution kernel 2 in groups of 16 channels, selector rank 64 and top-16, selector loss weight 1
#   optimizer   AdamW, lr --lr, betas (0.9, 0.999) (speculators' default), no weight decay, clip 1.0
#   schedule    linear warm-up over --warmup steps, then linear decay to 0, over --steps steps (default: one
#               epoch of the trainer whose packing plan has fewer batches, so that neither starts a second epoch)
#   batches     one packed row of at most --tokens-per-step tokens per step, fp32 compute, seed 0
#   DFlash      position weights exp(-(i-1)/gamma) (speculators' default for DFlash is D-PACE, which ours lacks:
#               speculators is given `--per-position-loss-weight fixed-exp-decay`)
#   DFlash,     slots attend to each other both ways inside a block, as DFlash drafts do (ours' default;
#   DSpark      speculators' is causal inside the block: it is given `--sliding-window-non-causal`)
#   DSpark      the same objective, 0.1 x CE on the data tokens + 0.9 x TV to the target (ours' default; speculators'
#               is kl_div: it is given `--loss-fn '{"ce": 0.1, "tv": 0.9}'`)
#   DSpark      no post-training confidence calibration on our side (speculators has none); the evaluator applies
#               the proposer's static cut (survival >= 0.2), so a draft that is never confident proposes nothing
#               ("no drafts": every step yields one token); such an algorithm is also scored with every drafted
#               token verified (`evaluate --all-drafts`), which compares the drafts themselves
#
# The same training rows: ours holds out a seeded random 10% of the samples; speculators holds out the last rows
# of its Arrow dataset, so the adapter writes our train rows first and our val rows last.
#
# speculators runs with `--draft-attn-impl sdpa --loss-implementation eager` (its fused losses and flex attention
# need Triton). CPU shims for speculators' trainer are those of `bench_train.py` (device 0 -> "cpu", accelerator sync a
# no-op; its cuda autocast is inactive on a CPU, so it computes in fp32 as ours does). Without autocast its DFlash
# feeds the bf16 states to an fp32 layer and stops, so it reads them as fp32 (`--hidden-states-dtype float32`, its
# own option; the values are the files' bf16 values, as ours reads them). The runs go one at a time
# (two torch jobs on 2 cores slow each other 5-50x), alternating which trainer goes first per algorithm. Every
# stage writes into --work and is skipped when its output is there, so an interrupted run resumes. A --work folder
# that holds files and no `.bench-train-quality` marker (one this script did not make) is refused.
#
#     .venv/bin/python -m engine regenerate --dataset sharegpt --split train --max-samples 600 --max-turns 1 \
#         --max-new-tokens 256 --max-length 768 --backend vllm --batch-size 32 --out /tmp/q/regen.jsonl
#     .venv/bin/python -m engine regenerate --dataset sharegpt --split val --max-samples 40 --max-turns 1 \
#         --max-new-tokens 256 --max-length 768 --backend vllm --batch-size 32 --out /tmp/q/regen-val.jsonl
#     .venv/bin/python benchmarks/bench_train_quality.py --train-jsonl /tmp/q/regen.jsonl \
#         --val-jsonl /tmp/q/regen-val.jsonl --work /tmp/q/work --ours-bf16 \
#         --json benchmarks/results/train_quality/<cpu>.json
#
# `--ours-bf16` adds a third run per algorithm: ours under bf16 autocast (`--precision bf16`), the CPU lever ours has
# and speculators lacks (its autocast is CUDA-only); it pays only on a CPU with native bf16 (AVX-512 BF16 or AMX).

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_train import (  # noqa: E402
    TARGET,
    VAL_FRACTION,
    build_speculators_data,
    cpu_at,
    planned_batches,
    proc_cpu_seconds,
    read_extraction,
    thread_env,
)
from benchmarks._results import command_line  # noqa: E402
from engine.cpu import cpu_model  # noqa: E402

SIDES = ("ours", "speculators")
MARKER = ".bench-train-quality"  # marks a --work folder as this script's (it removes run folders inside it)
OURS_BF16 = "ours-bf16"  # with --ours-bf16: our trainer again under bf16 autocast (its CPU lever; speculators' autocast
                         # is CUDA-only, so it has none here)
ALGOS = ("eagle3", "dflash", "peagle", "dspark", "dflash2")

# Per algorithm: the shaping flags both trainers take under the same names, ours' extra flags, speculators'
# extra flags, and the k values to score (up to what the draft proposes per step).
SHARED_FLAGS = {
    "eagle3": ["--ttt-steps", "3", "--draft-arch", "llama"],
    "dflash": ["--block-size", "8", "--max-anchors", "128", "--dflash-decay-gamma", "4.0"],
    "peagle": ["--num-depths", "4", "--max-anchors", "128", "--no-norm-before-residual"],
    "dspark": ["--block-size", "8", "--max-anchors", "128", "--markov-rank", "64"],
    "dflash2": ["--block-size", "8", "--max-anchors", "128", "--dflash-decay-gamma", "4.0", "--conv-kernel-size", "2",
                "--conv-group-size", "16", "--selector-rank", "64", "--selector-top-k", "16",
                "--selector-loss-alpha", "1.0"],
}
OURS_FLAGS = {"eagle3": [], "dflash": [], "peagle": [], "dspark": ["--calibration-blocks", "0"], "dflash2": []}
SPECULATORS_FLAGS = {"eagle3": [], "peagle": [],
                     "dflash": ["--per-position-loss-weight", "fixed-exp-decay", "--sliding-window-non-causal"],
                     "dspark": ["--sliding-window-non-causal", "--loss-fn", '{"ce": 0.1, "tv": 0.9}'],
                     "dflash2": ["--per-position-loss-weight", "fixed-exp-decay", "--sliding-window-non-causal"]}
EVAL_K = {"eagle3": "1-5", "dflash": "1-7", "peagle": "1-4", "dspark": "1-8", "dflash2": "1-7"}


# -- data -----------------------------------------------------------------------------------------------------


def run_logged(cmd: list[str], log: Path, threads: int) -> None:
    print("$", " ".join(cmd), flush=True)
    with open(log, "w", encoding="utf-8") as f:
        rc = subprocess.run(cmd, cwd=ROOT, env=thread_env(threads), stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"failed (exit {rc}): {' '.join(cmd)}\n{log.read_text(errors='replace')[-3000:]}")


def extract(jsonl: Path, out: Path, selector: list[str], threads: int) -> Path:
    """Our extractor over a regenerated JSONL (all its rows); skipped when the folder is complete."""
    if (out / "manifest.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    run_logged([sys.executable, "-m", "engine", "extract", "--dataset", str(jsonl), "--split", "all",
                "--max-length", "768", "--dtype", "bf16", *selector, "--out", str(out)],
               out.parent / f"{out.name}.log", threads)
    return out


def speculators_view(folder: Path, out: Path) -> dict:
    """speculators' view of our files (`bench_train.build_speculators_data`), rows ordered so that its last-rows
    validation split is our val split; built once (kept in --work)."""
    from engine.algos.common.batching import split_indices

    manifest, _, ids, _ = read_extraction(folder)
    train, val = split_indices(len(ids), VAL_FRACTION, 0)
    if not (out / "token_freq.pt").exists():
        build_speculators_data(folder, out, order=train + val)
    # its split index is int(rows * ratio): the ratio is nudged so that it lands on len(train) exactly
    return {"samples": len(ids), "tokens": sum(len(x) for x in ids), "train_rows": len(train),
            "train_ratio": (len(train) + 0.5) / len(ids), "aux_layer_ids": manifest["layer_ids"][:-1],
            "dtype": manifest["dtype"]}


def claim_work(work: Path) -> None:
    """Refuse a --work folder this script did not make (it removes run folders inside it); mark a new one."""
    marker = work / MARKER
    if work.exists() and any(work.iterdir()) and not marker.exists():
        raise SystemExit(f"{work} holds files this benchmark did not write (no {MARKER}): give --work a new or empty "
                         "folder; nothing was changed")
    work.mkdir(parents=True, exist_ok=True)
    marker.touch()


# -- the two trainers --------------------------------------------------------------------------------------


def is_ours(side: str) -> bool:
    return side.startswith("ours")


def full_vocabulary(algo: str) -> bool:
    """The algorithm drafts over the target's whole vocabulary: its typed arguments have no draft_vocab_size (both
    libraries refuse a reduced one for it)."""
    from engine.algos import ALGOS

    return "draft_vocab_size" not in ALGOS.get(algo).args_class.model_fields


def draft_vocab(a, algo: str) -> int:
    """--draft-vocab-size, or the target's whole vocabulary for an algorithm that drafts over all of it."""
    if not full_vocabulary(algo):
        return a.draft_vocab_size
    from engine.targets.resolve import resolve_target

    return json.loads((Path(resolve_target(TARGET).path) / "config.json").read_text())["vocab_size"]


def ours_command(a, algo: str, data: Path, out: Path, steps: int, precision: str = "fp32") -> list[str]:
    return [sys.executable, "-m", "engine", "train", "--algo", algo, "--data", str(data), "--target", TARGET,
            "--out", str(out), "--num-layers", "1",
            *([] if full_vocabulary(algo) else ["--draft-vocab-size", str(a.draft_vocab_size)]),  # ours: none then
            *SHARED_FLAGS[algo], *OURS_FLAGS[algo],
            "--tokens-per-batch", str(a.tokens_per_step), "--max-length", "768", "--lr", str(a.lr),
            "--betas", "0.9,0.999", "--weight-decay", "0", "--clip-grad", "1.0", "--scheduler", "linear",
            "--min-lr-ratio", "0", "--warmup-steps", str(a.warmup), "--epochs", "1", "--max-steps", str(steps),
            "--val-fraction", str(VAL_FRACTION), "--val-every", "1000000", "--val-max-batches", "4",
            "--checkpoint-every", "1000000", "--log-every", "1", "--device", "cpu", "--precision", precision,
            "--seed", "0"]


def speculators_command(a, algo: str, data: Path, info: dict, verifier: str, out: Path, steps: int) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--speculators-worker",
            str(out / "steps.jsonl"), "--",
            "--verifier-name-or-path", verifier, "--speculator-type", algo, "--num-layers", "1",
            "--target-layer-ids", *map(str, info["aux_layer_ids"]), "--draft-vocab-size", str(draft_vocab(a, algo)),
            *SHARED_FLAGS[algo], *SPECULATORS_FLAGS[algo], "--draft-attn-impl", "sdpa",
            "--loss-implementation", "eager",
            "--hidden-states-dtype",
            "float32",
            "--data-path", str(data), "--total-seq-len", str(a.tokens_per_step),
            "--train-data-ratio", f"{info['train_ratio']:.9f}", "--num-workers", "0", "--optimizer", "adamw",
            "--lr", str(a.lr), "--weight-decay", "0", "--scheduler-type", "linear",
            "--scheduler-warmup-steps", str(a.warmup), "--epochs", "1", "--max-steps", str(steps),
            "--log-freq", "1", "--save-path", str(out / "checkpoints"), "--log-dir", str(out / "logs"),
            "--seed", "0"]


def read_steps(side: str, out: Path) -> list[dict]:
    """Per-step records: wall time at the record, real tokens, loss."""
    if is_ours(side):
        path = out / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return [{"time": r["time"], "step": r["step"], "tokens": r["tokens"], "loss": r["loss"]}
                for r in rows if r["split"] == "train"]
    path = out / "steps.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [{"time": r["time"], "step": r["step"],
             "tokens": round(r["profile"]["tokens_per_s"] * r["profile"]["step_ms"] / 1000), "loss": r["loss"]}
            for r in rows]


def train(side: str, cmd: list[str], out: Path, threads: int, timeout: float) -> dict:
    """Run one trainer to its end (final checkpoint included), sampling its CPU time; resumable by its record."""
    record = out / "run.json"
    if record.exists():
        return json.loads(record.read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    with open(out / "stdout.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT)
        cpu: list[tuple[float, float]] = []
        while proc.poll() is None:
            c = proc_cpu_seconds(proc.pid)
            if c is not None:
                cpu.append((time.time(), c))
            if time.time() - start > timeout:
                proc.kill()
                raise SystemExit(f"{side} ran past {timeout:.0f} s (log: {out / 'stdout.log'})")
            time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed (exit {proc.returncode}):\n"
                         f"{(out / 'stdout.log').read_text(errors='replace')[-3000:]}")
    run = {"command": cmd, "steps": read_steps(side, out), "cpu": cpu, "process_s": time.time() - start}
    record.write_text(json.dumps(run))
    return run


def draft_folder(side: str, out: Path) -> Path:
    if is_ours(side):
        return out / "draft"
    epochs = sorted((p for p in (out / "checkpoints").iterdir() if p.is_dir() and p.name.isdigit()),
                    key=lambda p: int(p.name))
    if not epochs:
        raise SystemExit(f"speculators wrote no checkpoint under {out / 'checkpoints'}")
    return epochs[-1]


def throughput(run: dict, warmup: int) -> dict:
    """Tokens per CPU-second and per wall second over the steps after the first `warmup` ones."""
    steps = run["steps"]
    if len(steps) < warmup + 2:
        raise SystemExit(f"only {len(steps)} steps logged")
    measured, before = steps[warmup:], steps[warmup - 1]
    wall = measured[-1]["time"] - before["time"]
    cpu = cpu_at(run["cpu"], measured[-1]["time"]) - cpu_at(run["cpu"], before["time"])
    tokens = sum(s["tokens"] for s in measured)
    return {"steps": len(steps), "measured_steps": len(measured), "tokens": tokens, "wall_s": wall, "cpu_s": cpu,
            "tokens_per_cpu_s": tokens / cpu, "tokens_per_s": tokens / wall,
            "tokens_per_step": tokens / len(measured), "process_s": run["process_s"]}


def loss_curve(run: dict, points: int = 10) -> list[list[float]]:
    """[step, mean loss over the window ending there] at `points` even steps."""
    losses = [(s["step"], s["loss"]) for s in run["steps"] if s["loss"] is not None]
    if not losses:
        return []
    width = max(1, len(losses) // points)
    return [[losses[i][0], statistics.mean(x for _, x in losses[max(0, i - width + 1):i + 1])]
            for i in range(width - 1, len(losses), width)]


def evaluate(draft: Path, val: Path, ks: str, out: Path, threads: int, all_drafts: bool = False) -> dict:
    if not out.exists():
        run_logged([sys.executable, "-m", "engine", "evaluate", "--draft", str(draft), "--target", TARGET,
                    "--data", str(val), "--num-prompts", "1000", "--k", ks, "--dtype", "fp32", "--json", str(out),
                    *(["--all-drafts"] if all_drafts else [])], out.with_suffix(".log"), threads)
    result = json.loads(out.read_text())
    return {"num_samples": result["num_samples"],
            "tau": {k: v["mean_acceptance_length"] for k, v in result["by_k"].items()},
            "per_position": {k: v.get("per_position_acceptance") for k, v in result["by_k"].items()},
            "all_positions": {k: v.get("all_positions_acceptance_length") for k, v in result["by_k"].items()}}


def has_own_cut(algo: str) -> bool:
    """The algorithm's proposer may draft fewer tokens than k by its own rule (it overrides `walk_counts`)."""
    from engine.algos import ALGOS
    from engine.algos.base import DraftAlgorithm

    return type(ALGOS.get(algo)).walk_counts is not DraftAlgorithm.walk_counts


# -- main -----------------------------------------------------------------------------------------------------


def fmt(tau: float | None) -> str:
    return "no drafts" if tau is None else f"{tau:.3f}"


def table(results: dict) -> str:
    rows = ["| algorithm | trainer | τ k=1 | τ k=3 | best τ (k) | τ k=3, every draft verified | "
            "tokens per CPU-second | τ k=3 / speculators' | every draft verified / speculators' | "
            "tokens per CPU-s / speculators' |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    names = {"ours": "ours (fp32)", "speculators": "speculators 0.9.0 (fp32)", OURS_BF16: "ours (bf16 autocast)"}
    for algo, r in results.items():
        theirs = r["speculators"]
        for side in [x for x in (*SIDES, OURS_BF16) if x in r]:
            s = r[side]
            tau = s["eval"]["tau"]
            best = max(tau, key=lambda k: tau[k] or 1.0)
            every = (s.get("eval_all_drafts") or s["eval"])["tau"]["3"]
            their_every = (theirs.get("eval_all_drafts") or theirs["eval"])["tau"]["3"]
            ratio = every_ratio = speed = ""
            if is_ours(side):
                ratio = f"**{(tau['3'] or 1.0) / (theirs['eval']['tau']['3'] or 1.0):.3f}**"
                every_ratio = f"{(every or 1.0) / (their_every or 1.0):.3f}"
                speed = f"**{s['speed']['tokens_per_cpu_s'] / theirs['speed']['tokens_per_cpu_s']:.2f}×**"
            rows.append(f"| {algo} | {names[side]} | {fmt(tau['1'])} | {fmt(tau['3'])} | {fmt(tau[best])} ({best}) | "
                        f"{fmt(every)} | {s['speed']['tokens_per_cpu_s']:.0f} | {ratio} | {every_ratio} | {speed} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-jsonl", required=True, help="regenerated training conversations (JSONL)")
    p.add_argument("--val-jsonl", required=True, help="regenerated held-out conversations (JSONL)")
    p.add_argument("--work", required=True, help="working folder (kept; every stage resumes from it)")
    p.add_argument("--algos", default=",".join(ALGOS), help="comma-separated algorithms")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--tokens-per-step", type=int, default=2048, help="packed tokens per optimizer step (both)")
    p.add_argument("--steps", type=int, default=0,
                   help="optimizer steps per run (both; 0 = one epoch of the trainer whose plan has fewer batches)")
    p.add_argument("--warmup", type=int, default=10, help="LR warm-up steps; also left out of the speed figures")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2, help="torch/OpenMP threads of each run")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one training run may take")
    p.add_argument("--ours-bf16", action="store_true",
                   help="also train ours under bf16 autocast (after both fp32 runs of each algorithm)")
    p.add_argument("--json", help="write the results to this file")
    a = p.parse_args()
    algos = [x for x in a.algos.split(",") if x]
    unknown = sorted(set(algos) - set(ALGOS))
    if unknown:
        p.error(f"unknown algorithm(s) {unknown}: choose from {list(ALGOS)}")

    from importlib.metadata import version

    import torch
    import transformers

    from engine.algos import ALGOS as REGISTERED
    from engine.targets.resolve import resolve_target

    work = Path(a.work)
    claim_work(work)
    verifier = str(resolve_target(TARGET).path)
    layer_sets = {algo: [str(x) for x in REGISTERED.get(algo).default_layer_ids(30)] for algo in algos}
    union = sorted({int(x) for v in layer_sets.values() for x in v} | {30})
    val = extract(Path(a.val_jsonl), work / "val-extract", ["--layers", ",".join(map(str, union))], a.threads)
    results: dict[str, dict] = {}
    for n, algo in enumerate(algos):
        layers = layer_sets[algo]
        data = extract(Path(a.train_jsonl), work / f"extract-{'-'.join(layers)}",
                       ["--layers", ",".join([*layers, "30"])], a.threads)
        spec_data = work / f"speculators-data-{'-'.join(layers)}"
        info = speculators_view(data, spec_data)
        _, _, ids, _ = read_extraction(data)
        info["plans"] = planned_batches([len(x) for x in ids], a.tokens_per_step, VAL_FRACTION)
        epoch = min(v["batches"] for v in info["plans"].values())
        if a.steps > epoch:
            raise SystemExit(f"--steps {a.steps} exceeds one epoch of a trainer ({info['plans']}): lower it")
        steps = a.steps or epoch
        info["steps"] = steps
        results[algo] = {"data": info}
        sides = [*(SIDES if n % 2 == 0 else SIDES[::-1]), *([OURS_BF16] if a.ours_bf16 else [])]
        for side in sides:
            out = work / algo / side
            cmd = (ours_command(a, algo, data, out, steps, "bf16" if side == OURS_BF16 else "fp32") if is_ours(side)
                   else speculators_command(a, algo, spec_data, info, verifier, out, steps))
            run = train(side, cmd, out, a.threads, a.timeout)
            ev = evaluate(draft_folder(side, out), val, EVAL_K[algo], work / algo / f"eval-{side}.json", a.threads)
            results[algo][side] = {"command": cmd, "speed": throughput(run, a.warmup), "loss_curve": loss_curve(run),
                                   "eval": ev}
            if has_own_cut(algo):
                results[algo][side]["eval_all_drafts"] = evaluate(
                    draft_folder(side, out), val, EVAL_K[algo], work / algo / f"eval-{side}-all-drafts.json",
                    a.threads, all_drafts=True)
            print(f"  {algo} {side:11s}: tau " + ", ".join(f"k={k} {fmt(v)}" for k, v in ev["tau"].items())
                  + f"; {results[algo][side]['speed']['tokens_per_cpu_s']:.0f} tokens per CPU-s", flush=True)
        r = results[algo]
        r["cpu_ratio"] = r["ours"]["speed"]["tokens_per_cpu_s"] / r["speculators"]["speed"]["tokens_per_cpu_s"]
    print("\n" + table(results))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        from engine.provenance import provenance

        Path(a.json).write_text(json.dumps({
            **provenance("fp32", command=command_line("bench_train_quality.py", None)),
            "conditions": {"target": TARGET, "train_jsonl": a.train_jsonl, "val_jsonl": a.val_jsonl,
                           "steps": a.steps, "tokens_per_step": a.tokens_per_step, "lr": a.lr, "warmup": a.warmup,
                           "draft_vocab_size": a.draft_vocab_size, "threads": a.threads, "cpu": cpu_model(),
                           "cpu_count": os.cpu_count(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "speculators": version("speculators"),
                           "argv": sys.argv},
            "table": table(results), "results": results}, indent=2))


if __name__ == "__main__":
    main()
