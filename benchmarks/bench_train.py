"""Benchmark training throughput: our EAGLE-3 trainer against speculators 0.9.0's, on the same data and CPU."""

# Both train the same draft on the same extracted hidden states of the built-in SmolLM2-135M-Instruct
# (ShareGPT samples <= --max-length tokens, layers [2, 15, 27] + the last one): EAGLE-3, 1 Llama decoder
# layer, draft vocab --draft-vocab-size (top loss-token frequencies), 3 TTT steps, forward-KL loss, AdamW
# (lr 1e-3, no weight decay), grad clip 1.0, fp32 compute, one packed row of at most --tokens-per-step
# tokens per optimizer step, 90/10 train/val split, seed 0, no data-loader workers, one epoch at most.
#
# * ours:        `python -m engine train --data <extract> ...` (reads our files directly).
# * speculators: `speculators.train` (the module `python -m speculators.train` runs) with `--draft-attn-impl sdpa
#                --loss-implementation eager --optimizer adamw --num-workers 0`, on an adapter built here from the same
#                files: its Arrow dataset (`input_ids`, `loss_mask`, `seq_len`, saved with `save_to_disk`),
#                `hidden_states/hs_{j}.safetensors` (links to our files: same keys, last layer last, which its
#                loader splits off as the verifier's last hidden state) and `token_freq.pt` (our loss-token counts).
#                Its trainer assumes an accelerator, so the worker below applies two CPU shims and nothing else:
#                the device index 0 it moves model and batches to becomes "cpu", and `torch.accelerator.synchronize`
#                (called by its step timer; it raises without an accelerator) becomes a no-op. Its
#                `autocast("cuda", bf16)` is inactive on a CPU, so it computes in fp32 like ours.
#
# Tokens counted are the same kind on both sides: real (non-padding) positions of the shifted packed row, i.e.
# one per (input token, next-token target) pair fed to the draft. speculators always pads the row to
# --tokens-per-step and computes on the padding too; ours computes on the packed tokens only. Steady state:
# the first --warmup steps of each run are dropped. Per step, wall time is the interval between two consecutive
# step records of a run's own log (our metrics.jsonl, speculators' metric records), so it includes data loading
# and everything else a step costs; CPU time is sampled from /proc for the process over the same interval
# (robust to a loaded machine: with one thread it is the work done, not the share of the CPU obtained). A run
# is stopped once its last step is logged (final validation and checkpoint are not part of the measurement).
#
# The machine is shared and noisy, so the two trainers run alternately (ABBA over --rounds), each in a fresh
# subprocess with the same thread count (OMP/MKL_NUM_THREADS), and the ratios per round are reported.
#
#     .venv/bin/python -m engine extract --dataset sharegpt --algo eagle3 --max-samples 150 --max-length 512 \
#         --out /tmp/bench-train-data/extract      # or leave out --data below: the script extracts into --work
#     .venv/bin/python benchmarks/bench_train.py --data /tmp/bench-train-data/extract --rounds 4 --steps 12 \
#         --warmup 2 --threads 1 --json /tmp/bench_train.json

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.cpu import cpu_model  # noqa: E402

TARGET = "smollm2-135m-instruct"
SIDES = ("ours", "speculators")
VAL_FRACTION = 0.1  # both: ours holds out a random 10%, speculators the last 10% of the rows


# -- data: our extraction, and the speculators view of the same files ---------------------------------------


def extract(out: Path, samples: int, max_length: int, threads: int) -> None:
    """Our extractor (resumable: a finished folder is left as it is)."""
    cmd = [sys.executable, "-m", "engine", "extract", "--dataset", "sharegpt", "--algo", "eagle3",
           "--max-samples", str(samples), "--max-length", str(max_length), "--out", str(out)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env=thread_env(threads))


def read_extraction(folder: Path) -> tuple[dict, list[int], list[list[int]], list[list[int]]]:
    """(manifest, sample indices, token ids, loss masks) of an extracted folder, from the file headers."""
    from safetensors import safe_open

    from engine.data.store.files import read_manifest, sample_indices, sample_path

    manifest = read_manifest(folder)
    if manifest is None:
        raise SystemExit(f"{folder} has no manifest.json: extract first (or drop --data)")
    ids, masks = [], []
    indices = sample_indices(folder)
    for i in indices:
        with safe_open(str(sample_path(folder, i)), framework="pt") as f:
            ids.append(f.get_tensor("token_ids").tolist())
            masks.append(f.get_tensor("loss_mask").tolist())
    return manifest, indices, ids, masks


def build_speculators_data(folder: Path, out: Path, order: list[int] | None = None) -> dict:
    """What speculators' trainer reads, built from our files (the hidden states are linked, not copied); `order`:
    which of our samples (positions) become its rows, in that order (default: all, as they are).

    out/            Arrow dataset (input_ids int64, loss_mask int64, seq_len; torch format) via save_to_disk
    out/hidden_states/hs_{j}.safetensors -> folder/hs_{i}.safetensors  (j = Arrow row; its FileTransfer name)
    out/token_freq.pt  {token id: loss-token count} (its format; it derives d2t/t2d for --draft-vocab-size)
    """
    import torch
    from datasets import Dataset
    from safetensors.torch import load_file

    manifest, indices, ids, masks = read_extraction(folder)
    layers, n = manifest["layer_ids"], manifest["num_layers"]
    if not manifest.get("includes_last_layer") or layers[-1] != n:
        raise SystemExit(f"{folder} lacks the target's last layer {n} (layers {layers}): speculators' loader "
                         "takes hidden_states[:, -1] as the verifier's last hidden state; extract with --algo eagle3")
    order = list(range(len(ids))) if order is None else order
    if out.exists():
        shutil.rmtree(out)
    ds = Dataset.from_dict({"input_ids": [ids[p] for p in order], "loss_mask": [masks[p] for p in order],
                            "seq_len": [len(ids[p]) for p in order]})
    ds.set_format(type="torch")
    ds.save_to_disk(str(out))
    hs = out / "hidden_states"
    hs.mkdir()
    for j, p in enumerate(order):
        (hs / f"hs_{j}.safetensors").symlink_to(folder.resolve() / f"hs_{indices[p]}.safetensors")
    counts = load_file(str(folder / "token_freq.safetensors"))["counts"]
    nz = torch.nonzero(counts).flatten()
    torch.save(dict(zip(nz.tolist(), counts[nz].tolist(), strict=True)), out / "token_freq.pt")
    return {"samples": len(ids), "tokens": sum(len(x) for x in ids), "aux_layer_ids": layers[:-1],
            "last_layer": n, "dtype": manifest["dtype"]}


def planned_batches(lengths: list[int], tokens_per_step: int, val_ratio: float) -> dict:
    """Epoch-0 packing plans of both trainers (their own planners): batches per epoch and real tokens per batch."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    from engine.algos.common.batching import plan_packed_batches, split_indices

    train_idx, _ = split_indices(len(lengths), val_ratio, 0)
    ours = plan_packed_batches(train_idx, lengths, tokens_per_step, 0, 0)
    ours_tokens = [min(tokens_per_step, sum(lengths[i] - 1 for i in b)) for b in ours]
    n_train = int(len(lengths) * round(1 - val_ratio, 6))  # speculators: the first rows are the train split
    sampler = MultipackDistributedBatchSamplerV2(batch_max_length=tokens_per_step, lengths=lengths[:n_train],
                                                 num_replicas=1, rank=0, seed=0)
    theirs = sampler._generate_batches(0)  # noqa: SLF001 - its own packing, only counted here
    theirs_tokens = [min(tokens_per_step, sum(lengths[i] for i in b)) - len(b) for b in theirs]
    return {"ours": {"batches": len(ours), "mean_tokens": statistics.mean(ours_tokens)},
            "speculators": {"batches": len(theirs), "mean_tokens": statistics.mean(theirs_tokens)}}


# -- the two trainers --------------------------------------------------------------------------------------


def thread_env(threads: int) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "OPENBLAS_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def ours_command(a, data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "engine", "train", "--data", str(data), "--target", TARGET, "--out", str(out),
            "--num-layers", "1", "--draft-arch", "llama", "--draft-vocab-size", str(a.draft_vocab_size),
            "--ttt-steps", "3", "--tokens-per-batch", str(a.tokens_per_step), "--max-length", str(a.max_length),
            "--lr", "1e-3", "--weight-decay", "0", "--scheduler", "linear", "--warmup-steps", "0",
            "--epochs", "1", "--max-steps", str(a.steps), "--val-fraction", str(VAL_FRACTION), "--val-every", "1000000",
            "--val-max-batches", "2", "--checkpoint-every", "1000000", "--log-every", "1", "--device", "cpu",
            "--precision", "fp32", "--seed", "0"]


def speculators_command(a, data: Path, verifier: str, aux: list[int], out: Path) -> list[str]:
    return [sys.executable, __file__, "--speculators-worker", str(out / "steps.jsonl"), "--",
            "--verifier-name-or-path", verifier, "--speculator-type", "eagle3", "--num-layers", "1",
            "--draft-arch", "llama", "--target-layer-ids", *map(str, aux), "--draft-vocab-size",
            str(a.draft_vocab_size), "--draft-attn-impl", "sdpa", "--data-path", str(data),
            "--total-seq-len", str(a.tokens_per_step), "--train-data-ratio", str(round(1 - VAL_FRACTION, 6)),
            "--num-workers", "0",
            "--loss-implementation", "eager", "--ttt-steps", "3", "--optimizer", "adamw", "--lr", "1e-3",
            "--weight-decay", "0", "--epochs", "1", "--max-steps", str(a.steps), "--log-freq", "1",
            "--save-path", str(out / "checkpoints"), "--log-dir", str(out / "logs"), "--seed", "0"]


def speculators_worker(steps_file: str, argv: list[str]) -> None:
    """Run speculators' trainer in this process with the two CPU shims, recording one JSON line per step."""
    import logging

    import speculators.train.trainer as spec_trainer
    import torch
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig
    from speculators.train.logger import setup_root_logger

    if torch.accelerator.current_accelerator() is None:
        spec_trainer.get_local_rank = lambda: "cpu"   # it moves the model and each batch to `local_rank` (0)
        torch.accelerator.synchronize = lambda *a, **k: None  # its step timer syncs; nothing to wait for on a CPU

    class StepRecords(logging.Handler):
        def __init__(self):
            super().__init__()
            self.f = open(steps_file, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life

        def emit(self, record):
            msg = record.msg
            if isinstance(msg, dict) and "train" in msg and msg.get("profile"):
                row = {"time": time.time(), "step": msg["global_step"] + 1, "epoch": msg["epoch"],
                       "profile": msg["profile"], "loss": msg["train"].get("loss"),
                       "threads": torch.get_num_threads()}
                self.f.write(json.dumps(row) + "\n")
                self.f.flush()

    setup_root_logger()  # its own console handler first; main() calling it again is then a no-op
    logging.getLogger().handlers.insert(0, StepRecords())  # before its dict formatter rewrites the record
    sys.argv = ["speculators.train", *argv]
    main(TrainConfig.resolve())


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (all threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_steps(side: str, out: Path) -> list[dict]:
    """Per-step records of a run: wall time at the record, real tokens, the trainer's own step time, loss."""
    if side == "ours":
        path = out / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        return [{"time": r["time"], "step": r["step"], "epoch": r["epoch"], "tokens": r["tokens"],
                 "own_s": r["tokens"] / r["tokens_per_s"], "loss": r["loss"]} for r in rows if r["split"] == "train"]
    path = out / "steps.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [{"time": r["time"], "step": r["step"], "epoch": r["epoch"],
             "tokens": round(r["profile"]["tokens_per_s"] * r["profile"]["step_ms"] / 1000),
             "own_s": r["profile"]["step_ms"] / 1000, "loss": r["loss"], "threads": r["threads"]} for r in rows]


def run_side(side: str, cmd: list[str], out: Path, steps: int, threads: int, timeout: float) -> dict:
    """Run one trainer, sampling its CPU time, until its last step is logged (then it is stopped: the final
    validation and checkpoint are not measured); returns the per-step records and the CPU samples."""
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "stdout.log", "w", encoding="utf-8")  # noqa: SIM115
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT)
    cpu: list[tuple[float, float]] = []  # (wall time, process CPU seconds)
    done, checked = False, 0.0
    try:
        while proc.poll() is None:
            c = proc_cpu_seconds(proc.pid)
            if c is not None:
                cpu.append((time.time(), c))
            if time.time() - checked > 1.0:
                checked = time.time()
                if len(read_steps(side, out)) >= steps:
                    done = True
                    proc.kill()
                    proc.wait()
                    break
            if time.time() - start > timeout:
                proc.kill()
                raise SystemExit(f"{side} ran past {timeout:.0f} s (log: {out / 'stdout.log'})")
            time.sleep(0.05)
    finally:
        log.close()
    if not done and proc.returncode != 0:
        tail = (out / "stdout.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{side} failed (exit {proc.returncode}):\n{tail}")
    return {"steps": read_steps(side, out), "cpu": cpu, "process_s": time.time() - start}


def cpu_at(samples: list[tuple[float, float]], t: float) -> float:
    """Process CPU seconds at wall time t (linear interpolation between samples)."""
    for (t0, c0), (t1, c1) in pairwise(samples):
        if t0 <= t <= t1:
            return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
    return samples[-1][1] if t > samples[-1][0] else samples[0][1]


def steady_state(run: dict, warmup: int, padded: int | None) -> dict:
    """Tokens/s over steps warmup+1.. : wall (record to record), CPU (same intervals) and the trainer's own timer."""
    steps = run["steps"]
    if len(steps) < warmup + 2:
        raise SystemExit(f"only {len(steps)} steps logged; use more --steps or fewer --warmup")
    measured, before = steps[warmup:], steps[warmup - 1]  # step k's wall time = record k - record k-1
    wall = measured[-1]["time"] - before["time"]
    cpu = cpu_at(run["cpu"], measured[-1]["time"]) - cpu_at(run["cpu"], before["time"])
    tokens = sum(s["tokens"] for s in measured)
    n = len(measured)
    return {"steps": n, "first_step": measured[0]["step"], "tokens": tokens, "tokens_per_step": tokens / n,
            "positions_per_step": padded or tokens / n, "wall_s": wall, "cpu_s": cpu,
            "s_per_step": wall / n, "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu,
            "own_tokens_per_s": tokens / sum(s["own_s"] for s in measured),
            "epochs": sorted({s["epoch"] for s in measured}), "loss_first": steps[0]["loss"],
            "loss_last": steps[-1]["loss"], "process_s": run["process_s"]}


def table(summary: dict) -> str:
    rows = ["| trainer | real tokens/step | positions computed/step | CPU-s/step | wall s/step | tokens per CPU-second "
            "| tokens/s wall |", "|---|---|---|---|---|---|---|"]
    for side in SIDES:
        s = summary[side]
        name = "ours (`engine train`)" if side == "ours" else "speculators 0.9.0 (`speculators.train`)"
        rows.append(f"| {name} | {s['tokens_per_step']:.0f} | {s['positions_per_step']:.0f} | "
                    f"{s['cpu_s_per_step']:.2f} | {s['s_per_step']:.1f} | {s['tokens_per_cpu_s']:.0f} | "
                    f"{s['tokens_per_s']:.0f} |")
    return "\n".join(rows)


# -- main -----------------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an extracted folder to reuse (default: extract into --work)")
    p.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    p.add_argument("--samples", type=int, default=150, help="ShareGPT samples to extract")
    p.add_argument("--max-length", type=int, default=512, help="tokens per sample at most")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--tokens-per-step", type=int, default=1024, help="packed tokens per optimizer step (both)")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of the measurement (>= 1)")
    p.add_argument("--rounds", type=int, default=2, help="runs per trainer, alternating (ABBA)")
    p.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads of each trainer")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--speculators-worker", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args()
    if args.speculators_worker:
        speculators_worker(args.speculators_worker, [x for x in rest if x != "--"])
        return
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.warmup < 1:
        p.error("--warmup must be at least 1 (a step's time is measured from the previous step's record)")

    from importlib.metadata import version

    import torch
    import transformers

    from engine.targets.resolve import resolve_target

    tmp = None if args.work else tempfile.mkdtemp(prefix="bench-train-")
    work = Path(args.work or tmp)
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = Path(args.data) if args.data else work / "extract"
        if not args.data:
            extract(data, args.samples, args.max_length, max(args.threads, 2))
        info = build_speculators_data(data, work / "speculators-data")
        _, _, ids, _ = read_extraction(data)
        plans = planned_batches([len(x) for x in ids], args.tokens_per_step, VAL_FRACTION)
        verifier = resolve_target(TARGET).path
        print(f"{info['samples']} samples, {info['tokens']} tokens, layers {info['aux_layer_ids']} + "
              f"{info['last_layer']} ({info['dtype']}); batches per epoch: ours {plans['ours']['batches']}, "
              f"speculators {plans['speculators']['batches']}; {args.threads} thread(s)", flush=True)
        if args.steps > min(v["batches"] for v in plans.values()):
            raise SystemExit(f"--steps {args.steps} exceeds one epoch of a trainer ({plans}); lower it: "
                             "speculators validates and checkpoints between epochs")
        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {s: [] for s in SIDES}
        for r in range(args.rounds):
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            for side in order:
                out = work / f"{side}-{r}"
                if out.exists():
                    shutil.rmtree(out)
                cmd = (ours_command(args, data, out) if side == "ours" else
                       speculators_command(args, work / "speculators-data", verifier, info["aux_layer_ids"], out))
                raw = run_side(side, cmd, out, args.steps, args.threads, args.timeout)
                res = steady_state(raw, args.warmup, args.tokens_per_step if side == "speculators" else None)
                res["command"] = cmd
                runs[side].append(res)
                print(f"  round {r + 1} {side:11s}: {res['tokens_per_s']:7.1f} tok/s wall, "
                      f"{res['tokens_per_cpu_s']:7.1f} tok/CPU-s, {res['s_per_step']:.2f} s/step, "
                      f"{res['tokens_per_step']:.0f} tokens/step (loss {res['loss_first']:.2f} -> "
                      f"{res['loss_last']:.2f})", flush=True)
                if len(res["epochs"]) > 1:
                    print(f"  warning: the measured steps of {side} span epochs {res['epochs']}", flush=True)
                shutil.rmtree(out / "checkpoints", ignore_errors=True)
                shutil.rmtree(out / "draft", ignore_errors=True)
        load_after = os.getloadavg()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    def pooled(side: str, key: str) -> float:
        rs = runs[side]
        return sum(x["tokens"] for x in rs) / sum(x[key] for x in rs)

    ratios = {key: [o[key] / s[key] for o, s in zip(runs["ours"], runs["speculators"], strict=True)]
              for key in ("tokens_per_s", "tokens_per_cpu_s", "own_tokens_per_s")}
    summary = {side: {"tokens_per_s": pooled(side, "wall_s"), "tokens_per_cpu_s": pooled(side, "cpu_s"),
                      "tokens_per_step": statistics.mean(x["tokens_per_step"] for x in runs[side]),
                      "positions_per_step": statistics.mean(x["positions_per_step"] for x in runs[side]),
                      "s_per_step": statistics.median(x["s_per_step"] for x in runs[side]),
                      "cpu_s_per_step": statistics.median(x["cpu_s"] / x["steps"] for x in runs[side])}
               for side in SIDES}
    ratio = {k: statistics.median(v) for k, v in ratios.items()}
    print("\n" + table(summary))
    print(f"\nours / speculators: {ratio['tokens_per_cpu_s']:.2f}x tokens per CPU-second, {ratio['tokens_per_s']:.2f}x "
          "tokens/s wall (medians over rounds; per round CPU: "
          + ", ".join(f"{x:.2f}x" for x in ratios["tokens_per_cpu_s"]) + "; wall: "
          + ", ".join(f"{x:.2f}x" for x in ratios["tokens_per_s"]) + f"); load average {load_before[0]:.1f} "
          f"before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs")
    if args.json:
        from benchmarks._results import command_line
        from engine.provenance import provenance

        Path(args.json).write_text(json.dumps({
            **provenance("fp32", command=command_line("bench_train.py", None)),
            "conditions": {"samples": info["samples"], "tokens": info["tokens"], "max_length": args.max_length,
                           "draft_vocab_size": args.draft_vocab_size, "tokens_per_step": args.tokens_per_step,
                           "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                           "threads": args.threads, "plans": plans, "cpu_count": os.cpu_count(),
                           "cpu": cpu_model(), "load_before": load_before,
                           "load_after": load_after, "torch": torch.__version__,
                           "transformers": transformers.__version__, "speculators": version("speculators"),
                           "argv": sys.argv},
            "table": table(summary), "runs": runs, "summary": summary, "ratios_per_round": ratios, "ratio": ratio},
            indent=2))


if __name__ == "__main__":
    main()
