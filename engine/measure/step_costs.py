"""Speed on this machine: the measured cost of a verify step and of drafting, and the speedup they forecast."""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence


def measure_step_costs(target, algorithm, draft, ks: Sequence[int], *, context: Sequence[int],
                       repeats: int = 5) -> dict[str, Any]:
    """On this machine: the target's forward over k+1 tokens and the draft's proposal of k tokens, both in units
    of one single-token target forward (medians over `repeats`)."""
    from engine.generate.metrics import measure_cost_curve
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams

    ks = sorted(set(int(k) for k in ks))
    verify = measure_cost_curve(TargetRunner(target), list(context), [k + 1 for k in ks], repeats=repeats)
    runner = TargetRunner(target, algorithm.aux_layer_ids(draft))
    runner.reset()
    logits, aux = runner.forward(list(context), all_logits=False)  # prefill of the context
    base = runner.length
    one = []
    for _ in range(repeats):  # one single-token target step, measured here too (same context length)
        t = time.perf_counter()
        runner.forward(list(context[-1:]))
        one.append(time.perf_counter() - t)
        runner.crop(base)
    one_s = statistics.median(one)
    first = int(logits[-1].argmax())
    draft_cost: dict[int, float] = {}
    params = SamplingParams()
    for k in ks:
        samples = []
        for _ in range(repeats):
            proposer = algorithm.proposer(draft)
            proposer.start(list(context), aux, first)
            t = time.perf_counter()
            proposer.propose(k, params, None)
            samples.append(time.perf_counter() - t)
        draft_cost[k] = statistics.median(samples) / one_s
    return {"verify_cost": {k: verify[k + 1] for k in ks}, "draft_cost": draft_cost,
            "target_step_ms": one_s * 1e3, "context_tokens": len(context)}


def forecast(result: dict[str, Any], costs: dict[str, Any]) -> dict[str, Any]:
    """Speedup for each k = tokens per step / (verification + drafting), in single-token target steps.

    A baseline step commits one token at cost 1; a speculative step commits the mean acceptance length at cost
    v(k+1) + c_draft(k) (the rest of the loop is ignored)."""
    rows = {}
    for key, acc in result["by_k"].items():
        k = int(key)
        tau = acc["mean_acceptance_length"]
        v, c = costs["verify_cost"].get(k), costs["draft_cost"].get(k)
        rows[key] = {"mean_acceptance_length": tau, "verify_cost": v, "draft_cost": c,
                     "step_cost": (v + c) if v is not None and c is not None else None,
                     "speedup": tau / (v + c) if tau and v is not None and c is not None else None}
    best = max(rows, key=lambda key: rows[key]["speedup"] or 0.0)
    pays = (rows[best]["speedup"] or 0.0) > 1.0
    # no k is recommended when even the fastest forecasts a slowdown: decoding without this draft is faster here
    return {"by_k": rows, "fastest_k": int(best), "recommended_k": int(best) if pays else None,
            "target_step_ms": costs["target_step_ms"]}


def recommendation(fc: dict[str, Any] | None, where: str = "on this machine") -> str:
    """The forecast's advice in words: the k to use, or that speculating with this draft is slower (`where`: the
    machine whose costs the forecast used)."""
    if not fc or not fc.get("by_k"):
        return ""
    fastest = str(fc.get("fastest_k") or max(fc["by_k"], key=lambda key: fc["by_k"][key].get("speedup") or 0.0))
    best = fc["by_k"].get(fastest, {}).get("speedup")
    if best is not None and best > 1.0:
        return f"recommended k {where}: {fastest} (forecast {best:.2f}×)"
    return (f"no speculation with this draft: every k forecasts slower than the target alone {where}"
            + (f" (best: k = {fastest} at {best:.2f}×)" if best is not None else "")
            + "; decode without it, or try the n-gram proposer")
