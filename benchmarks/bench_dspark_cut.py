"""Benchmark DSpark's static confidence cut: verified tokens per step and wall-clock, with and without the cut."""

# A DSpark draft is trained briefly (the tiny random Llama target of the tests by default, online ShareGPT data, a
# few epochs; the TV term teaches it the target's own distribution) and calibrated on its validation split; then the
# same prompts are decoded greedily (fp32, CPU) once per confidence threshold, interleaved prompt by prompt so every
# setting sees the same machine load. Greedy output is identical for every threshold (checked), so the settings
# differ only in how many drafted tokens the target verifies per step and in how many it accepts.
#
#     .venv/bin/python benchmarks/bench_dspark_cut.py --prompts 20 --thresholds 0,0.1,0.2,0.3,0.5 \
#         --json benchmarks/results/cut/dspark_tiny.json

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def train_draft(target_dir: Path, out: Path, args) -> Path:
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer

    cfg = TrainConfig(algo="dspark", target=str(target_dir), online_dataset="sharegpt",
                      online_max_samples=args.train_samples, out=str(out), tokens_per_batch=512, max_length=160,
                      epochs=args.epochs, warmup_steps=4, lr=3e-3, val_fraction=0.2, val_every=10 ** 6,
                      checkpoint_every=10 ** 6,
                      algo_args={"num_layers": 1, "block_size": args.block, "max_anchors": 128, "markov_rank": 32})
    return Trainer(cfg).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft", default=None, help="a trained DSpark draft folder (default: train one briefly)")
    parser.add_argument("--target", default=None, help="its target (default: the tests' tiny random Llama)")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--block", type=int, default=6, help="block size of the briefly trained draft")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--train-samples", type=int, default=48)
    parser.add_argument("--thresholds", default="0,0.1,0.2,0.3,0.5")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadier on a shared machine)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from benchmarks._results import command_line
    from engine.algos.loading import draft_algorithm
    from engine.data.prompts.load import load_prompts
    from engine.fsutil import atomic_write_json
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all
    from engine.provenance import provenance
    from engine.targets.dtypes import dtype_name
    from engine.targets.loading import load_target

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_dspark_"))
    target_ref = args.target
    if target_ref is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import save_tiny_target

        target_ref = str(save_tiny_target(work / "tiny"))
    t0 = time.perf_counter()
    draft_dir = Path(args.draft) if args.draft else train_draft(Path(target_ref), work / "run", args)
    train_s = time.perf_counter() - t0
    calibration = None
    if not args.draft and (work / "run" / "calibration.json").is_file():
        calibration = json.loads((work / "run" / "calibration.json").read_text())
    target = load_target(target_ref)
    algorithm = draft_algorithm(draft_dir)
    draft = algorithm.load(draft_dir, target)
    k = draft.block_size
    thresholds = [float(x) for x in args.thresholds.split(",")]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, eos_token_ids=[target.tokenizer.eos_token_id])
    prompts = load_prompts("sharegpt", args.prompts, 0, 600)
    runner = TargetRunner(target, algorithm.aux_layer_ids(draft))
    base_runner = TargetRunner(target)
    totals = {t: {"steps": 0, "verified": 0, "accepted": 0, "tokens": 0, "seconds": 0.0} for t in thresholds}
    baseline = {"tokens": 0, "seconds": 0.0}
    identical = True
    for prompt in prompts:
        ids = prompt_ids(target.tokenizer, prompt)
        ts = time.perf_counter()
        base, _ = generate_all(base_runner, ids, params)
        baseline["seconds"] += time.perf_counter() - ts
        baseline["tokens"] += len(base)
        for t in thresholds:
            proposer = algorithm.proposer(draft, confidence_threshold=t)
            ts = time.perf_counter()
            out, events = generate_all(runner, ids, params, proposer, k)
            row = totals[t]
            row["seconds"] += time.perf_counter() - ts
            identical &= out == base
            steps = [e for e in events if e.step > 0]
            row["steps"] += len(steps)
            row["verified"] += sum(e.drafted for e in steps)
            row["accepted"] += sum(e.accepted for e in steps)
            row["tokens"] += len(out)
    results = []
    for t, row in totals.items():
        steps = max(1, row["steps"])
        results.append({
            "threshold": t, "steps": row["steps"],
            "verified_tokens_per_step": round(row["verified"] / steps, 3),
            "accepted_tokens_per_step": round(row["accepted"] / steps, 3),
            "acceptance_rate": round(row["accepted"] / max(1, row["verified"]), 3),
            "mean_acceptance_length": round((row["accepted"] + steps) / steps, 3),
            "wasted_verified_tokens_per_step": round((row["verified"] - row["accepted"]) / steps, 3),
            "seconds": round(row["seconds"], 2), "tokens_per_s": round(row["tokens"] / row["seconds"], 1),
            "speedup_vs_baseline": round(baseline["seconds"] / row["seconds"], 3),
        })
    report = {"what": "DSpark static confidence cut: the same prompts decoded greedily with each threshold",
              "target": "tests/tiny.py random Llama (4 layers, hidden 64)" if args.target is None else args.target,
              "draft": str(draft_dir) if args.draft else f"trained here for {args.epochs} epochs on "
                       f"{args.train_samples} ShareGPT samples ({train_s:.0f} s), block {k}",
              "calibration": calibration, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "k": k,
              "device": "cpu", "threads": args.threads, "outputs_identical_to_baseline": identical,
              "baseline": {"seconds": round(baseline["seconds"], 2),
                           "tokens_per_s": round(baseline["tokens"] / baseline["seconds"], 1)},
              "results": results,
              **provenance(dtype_name(target.dtype), command=command_line("bench_dspark_cut.py", None))}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(args.json), report)
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
