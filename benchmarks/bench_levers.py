"""What each proposer lever buys in-process: the evaluator's exact τ and forecast, and decoding, per workload."""

# One factor at a time beside the same draft (default: the shipped EAGLE-3 draft of the built-in target), on the
# same held-out prompts of each workload, greedy:
#   1. the evaluator (decoding-exact walk) for every setting and k, its speedup forecast from step costs timed once
#      here: the draft alone, confidence cuts (p_min), draft_ngram at each min match, and the two together;
#   2. decoding: the baseline, n-gram, the draft at its k and the best forecast settings of each lever, interleaved
#      prompt by prompt (each prompt decoded by every method before the next), in rounds; speedup = the baseline's
#      time over the method's, the mean over rounds with its 95% interval; every output checked against the baseline.
#
#     .venv/bin/python benchmarks/bench_levers.py --workloads general,sharegpt --num-prompts 16 \
#         --max-new-tokens 128 --json benchmarks/results/levers/amd-epyc-zen5.json

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _results import command_line, print_and_save  # noqa: E402

P_MINS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
MIN_MATCHES = (2, 3, 4, 5)


def settings() -> list[dict[str, Any]]:
    """Every proposer setting the evaluator scores: the draft, each lever alone, and the pairs of the two."""
    out = [{"method": "draft", "p_min": None}]
    out += [{"method": "draft", "p_min": p} for p in P_MINS]
    out += [{"method": "draft_ngram", "p_min": None, "ngram_min_match": m} for m in MIN_MATCHES]
    out += [{"method": "draft_ngram", "p_min": p, "ngram_min_match": m} for p in P_MINS for m in MIN_MATCHES]
    return out


def label(s: dict[str, Any]) -> str:
    """"draft", "draft p_min 0.5", "draft_ngram m3", "draft_ngram m3 p_min 0.5"."""
    words = [s["method"]] + ([f"m{s['ngram_min_match']}"] if s["method"] == "draft_ngram" else [])
    return " ".join(words + ([f"p_min {s['p_min']:g}"] if s.get("p_min") else []))


def forecast_rows(algorithm, draft, samples, ks, costs) -> list[dict[str, Any]]:
    """Every setting through the evaluator: τ, tokens per step and forecast speedup at each k."""
    from engine.measure.evaluate import evaluate_samples
    from engine.measure.options import EvaluateOptions
    from engine.measure.step_costs import forecast

    rows = []
    for s in settings():
        o = EvaluateOptions(max_new_tokens=0, **{k: v for k, v in s.items() if v is not None})
        result = evaluate_samples(algorithm, draft, samples, ks, o)
        fc = forecast(result, costs)
        for k in ks:
            acc, f = result["by_k"][str(k)], fc["by_k"][str(k)]
            rows.append({"setting": label(s), **s, "k": k, "mean_acceptance_length": acc["mean_acceptance_length"],
                         "tokens_per_step": acc["tokens_per_step"], "draft_tokens_per_step":
                         acc["num_draft_tokens"] / sum(n for *_, n in acc["step_shapes"]),
                         "forecast_speedup": f["speedup"], "step_cost": f["step_cost"]})
    return rows


def best(rows: list[dict[str, Any]], keep) -> dict[str, Any]:
    return max((r for r in rows if keep(r)), key=lambda r: r["forecast_speedup"] or 0.0)


def decode_methods(forecasts: list[dict[str, Any]], k: int) -> dict[str, dict[str, Any]]:
    """What decoding measures: the draft at k, and the best forecast setting of each lever and of both."""
    chosen = {"draft": {"method": "draft", "p_min": None, "k": k}}
    for keep in (lambda r: r["method"] == "draft" and r["p_min"],  # the cut alone, the n-gram alone, both
                 lambda r: r["method"] == "draft_ngram" and not r["p_min"],
                 lambda r: r["method"] == "draft_ngram" and r["p_min"]):
        b = best(forecasts, keep)
        chosen[label(b) + f" k{b['k']}"] = {key: b.get(key) for key in ("method", "p_min", "ngram_min_match", "k")}
    return chosen


def measure(target, draft_model, prompts, params, methods, rounds: int) -> dict[str, Any]:
    """Every method on every prompt, interleaved prompt by prompt, in rounds: seconds, outputs, acceptance. A round
    that other processes loaded (engine.cpu.OtherLoad) is kept in the record and left out of the speedups, unless
    every round was."""
    from engine.algos.loading import make_proposer
    from engine.cpu import OtherLoad, under_load
    from engine.generate.metrics import SpecMetrics
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.speculative import generate
    from engine.measure.spread import mean_interval

    encoded = [prompt_ids(target.tokenizer, p) for p in prompts]
    names = ["baseline", "ngram", *methods]
    per_round = []
    outputs: dict[str, list[list[int]]] = {}
    metrics = {m: SpecMetrics() for m in names}
    for r in range(rounds):
        seconds, load = dict.fromkeys(names, 0.0), OtherLoad()
        for ids in encoded:
            for m in names:
                spec = methods.get(m, {"method": m, "k": 3})
                opts = {key: spec[key] for key in ("p_min", "ngram_min_match") if spec.get(key)}
                proposer = make_proposer(spec["method"], target, draft_model=draft_model, **opts)
                runner = TargetRunner(target, getattr(proposer, "aux_layer_ids", None))
                run, out = SpecMetrics(), []
                for event in generate(runner, ids, params, proposer, spec.get("k", 3)):
                    run.observe(event)
                    out.extend(event.tokens)
                seconds[m] += run.total_seconds
                if r == 0:
                    outputs.setdefault(m, []).append(out)
                    metrics[m].merge(run)
        share = load.share()
        per_round.append({"seconds": seconds, "other_load": None if share is None else round(share, 3),
                          "clean": not under_load(share)})
        print(f"round {r + 1}/{rounds} (other load {share}): " + ", ".join(f"{m} {s:.1f} s" for m, s in
                                                                          seconds.items()), flush=True)
    base = outputs["baseline"]
    kept = [rd for rd in per_round if rd["clean"]] or per_round
    result = {}
    for m in names:
        ratios = [rd["seconds"]["baseline"] / rd["seconds"][m] for rd in kept]
        spread = mean_interval(ratios)
        result[m] = {**methods.get(m, {"method": m}), "speedup": spread["mean"], "ci95": spread["ci95"],
                     "mean_acceptance_length": metrics[m].mean_acceptance_length,
                     "tokens_per_s": metrics[m].tokens_per_s,
                     "identical_to_baseline": outputs[m] == base,
                     "identical_prompts": sum(a == b for a, b in zip(outputs[m], base, strict=True))}
    return {"rounds": per_round, "methods": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft", default=None, help="draft folder (default: the shipped EAGLE-3 draft)")
    parser.add_argument("--workloads", default="general,sharegpt")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", default="1-5", help="k values the evaluator scores")
    parser.add_argument("--decode-k", type=int, default=3, help="the plain draft's k in decoding")
    parser.add_argument("--rounds", type=int, default=3, help="decoding rounds (each: every prompt, every method)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from engine.algos.loading import draft_algorithm, load_decoding_draft
    from engine.algos.shipped import default_draft
    from engine.data.prompts.load import load_prompts
    from engine.generate.kernel_choice import load_decode_target
    from engine.generate.sampling import SamplingParams
    from engine.measure.evaluate import held_out_answers
    from engine.measure.options import parse_ks
    from engine.measure.step_costs import measure_step_costs
    from engine.targets.dtypes import dtype_name
    from engine.targets.resolve import DEFAULT_TARGET

    torch.manual_seed(0)
    draft_path = args.draft or default_draft(DEFAULT_TARGET)
    algorithm = draft_algorithm(draft_path)
    target = load_decode_target(DEFAULT_TARGET, args.dtype)
    draft = load_decoding_draft(draft_path, target)
    ks = parse_ks(args.k)
    aux = algorithm.aux_layer_ids(draft)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, eos_token_ids=[target.tokenizer.eos_token_id])
    out: dict[str, Any] = {"command": command_line("bench_levers.py", argv), "draft": str(draft_path),
                           "algorithm": algorithm.name, "num_prompts": args.num_prompts,
                           "max_new_tokens": args.max_new_tokens, "kernel": target.extra.get("kernel_summary"),
                           "dtype": dtype_name(target.dtype), "workloads": {}}
    started = time.time()
    for workload in args.workloads.split(","):
        prompts = load_prompts(workload, args.num_prompts, 0, 1500)
        samples = held_out_answers(target, prompts, aux, args.max_new_tokens)
        context = samples[0].token_ids[: samples[0].prompt_len].tolist()
        costs = measure_step_costs(target, algorithm, draft, ks, context=context)
        forecasts = forecast_rows(algorithm, draft, samples, ks, costs)
        methods = decode_methods(forecasts, args.decode_k)
        decoded = measure(target, draft, prompts, params, methods, args.rounds)
        out["workloads"][workload] = {"costs": costs, "forecasts": forecasts, "rounds": decoded["rounds"],
                                      "decoded": decoded["methods"]}
        print(f"{workload}: done in {time.time() - started:.0f} s", flush=True)
    out["seconds"] = round(time.time() - started, 1)
    print_and_save(out, table(out), args.json)
    return 0


def table(result: dict[str, Any]) -> str:
    """Per workload: each decoded method's τ, speedup (interval) and the evaluator's forecast of the same setting."""
    lines = ["| workload | method | τ | speedup (95% interval) | forecast | identical |", "|---|---|---|---|---|---|"]
    for workload, w in result["workloads"].items():
        for name, d in w["decoded"].items():
            f = next((r["forecast_speedup"] for r in w["forecasts"] if r["method"] == d.get("method")
                      and r["p_min"] == d.get("p_min") and r.get("ngram_min_match") == d.get("ngram_min_match")
                      and r["k"] == d.get("k")), None)
            tau, ci = d["mean_acceptance_length"], d["ci95"]
            cells = [workload, name, f"{tau:.2f}" if tau else "–",
                     f"{d['speedup']:.2f}×" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else ""),
                     f"{f:.2f}×" if f else "–", f"{d['identical_prompts']}/{result['num_prompts']}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
