"""Benchmark the offline evaluator against real decoding: the same held-out samples, the shipped draft."""

# Three things are timed in one process on the built-in SmolLM2-135M-Instruct (CPU, fp32, greedy):
#
# * data:     the target answers each held-out prompt once (its greedy answer plus one forward for the draft's
#             layers): what `extract` of a regenerated val split stores once for every later evaluation;
# * evaluate: `engine.measure.evaluate.evaluate_samples` on those samples for k = 1..5 (one draft pass per sample);
# * bench:    what `bench --methods baseline,draft` does to measure the same thing for one k: the baseline and
#             speculative decoding of every prompt (models loaded once, as in `bench`).
#
# The machine is shared and noisy, so the three are interleaved prompt by prompt (each sees the same load), and
# both wall-clock and process CPU time are summed per method. It also checks that evaluate's mean acceptance
# length at k equals bench's on the same prompts.
#
#     .venv/bin/python benchmarks/bench_evaluate.py --samples 200 --max-new-tokens 32 --k 3 --threads 1 --json out.json

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-prompt-chars", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadier on a shared machine)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from benchmarks._results import command_line
    from engine.algos.loading import draft_algorithm
    from engine.algos.shipped import default_draft
    from engine.data.prompts.load import load_prompts
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all
    from engine.measure.evaluate import samples_from_prompts
    from engine.provenance import provenance
    from engine.targets.dtypes import dtype_name
    from engine.targets.loading import load_target

    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m-instruct")
    path = default_draft("smollm2-135m-instruct")
    algorithm = draft_algorithm(path)
    draft = algorithm.load(path, target)
    prompts = load_prompts("sharegpt", args.samples, 0, args.max_prompt_chars)

    from engine.generate.acceptance import Acceptance, walk
    from engine.generate.metrics import SpecMetrics

    wall = {"data": 0.0, "evaluate": 0.0, "bench": 0.0}
    cpu = dict(wall)
    acc = {k: Acceptance(k) for k in range(1, 6)}
    measured_metrics = SpecMetrics()
    aux_ids = algorithm.aux_layer_ids(draft)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, eos_token_ids=[target.tokenizer.eos_token_id])
    baseline_runner, draft_runner = TargetRunner(target), TargetRunner(target, aux_ids)
    from tqdm import tqdm

    for prompt in tqdm(prompts, desc="interleaved"):
        t, c = time.perf_counter(), time.process_time()
        sample = samples_from_prompts(target, [prompt], aux_ids, max_new_tokens=args.max_new_tokens)[0]
        wall["data"] += time.perf_counter() - t
        cpu["data"] += time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        a_big = algorithm.acceptance_counts(draft, sample.aux, sample.token_ids, 5).tolist()
        for k in acc:
            a = [min(x, k) for x in a_big]
            acc[k].add(walk(a, sample, k, args.max_new_tokens), [])
        wall["evaluate"] += time.perf_counter() - t
        cpu["evaluate"] += time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        ids = prompt_ids(target.tokenizer, prompt)  # bench's two runs, with the draft loaded once (as bench does)
        generate_all(baseline_runner, ids, params)
        _, events = generate_all(draft_runner, ids, params, algorithm.proposer(draft), args.k)
        wall["bench"] += time.perf_counter() - t
        cpu["bench"] += time.process_time() - c
        for event in events:
            if event.drafted:
                measured_metrics.num_drafts += 1
                measured_metrics.num_accepted_tokens += event.accepted
    result = {"by_k": {str(k): v.to_dict() for k, v in acc.items()}}
    samples = prompts
    data_s, evaluate_s, bench_s = wall["data"], wall["evaluate"], wall["bench"]
    evaluated = result["by_k"][str(args.k)]["mean_acceptance_length"]
    measured = measured_metrics.mean_acceptance_length
    out = {"samples": len(samples), "max_new_tokens": args.max_new_tokens, "k": args.k,
           "data_seconds": data_s, "evaluate_seconds": evaluate_s, "bench_seconds": bench_s,
           "evaluate_vs_bench": evaluate_s / bench_s, "online_evaluate_vs_bench": (data_s + evaluate_s) / bench_s,
           "cpu_seconds": cpu, "evaluate_vs_bench_cpu": cpu["evaluate"] / cpu["bench"],
           "evaluated_mean_acceptance_length": evaluated, "bench_mean_acceptance_length": measured,
           "evaluated_by_k": {k: v["mean_acceptance_length"] for k, v in result["by_k"].items()},
           **provenance(dtype_name(target.dtype), command=command_line("bench_evaluate.py", None))}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
