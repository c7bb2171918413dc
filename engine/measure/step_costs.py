"""Speed on this machine: the measured cost of a verify step and of drafting, and the speedup they forecast."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.cpu import OtherLoad, load_text, under_load
from engine.generate.metrics import time_forwards_round_robin
from engine.jobs import Ticks

STEP_FLOOR = 0.97   # a step that verifies k+1 tokens cannot cost less than a one-token step (3% timer slack)
COST_ATTEMPTS = 3   # step costs measured again at most this often when under load or below the floor
COST_REPEATS = 7    # rounds of every shape in one attempt


def step_cost_units(ks: Sequence[int], repeats: int = COST_REPEATS) -> int:
    """The timings of one attempt at the step costs (every shape and the proposals, per round): its size."""
    return repeats * (len({1, *(int(k) + 1 for k in ks)}) + 1)


def measure_step_costs(target, algorithm, draft, ks: Sequence[int], *, context: Sequence[int],
                       repeats: int = COST_REPEATS,
                       on_step: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """On this machine: the target's forward over k+1 tokens and the draft's proposal of k tokens, in one-token
    target forwards (`_step_costs`). Costs taken under load, or with a verification cheaper than one token's forward,
    are measured again; if every attempt was so, they carry a `label` and the forecast recommends nothing.
    `on_step(done, total)`: timings done so far, a new attempt adding its own (default: the job's progress)."""
    ticks = Ticks(step_cost_units(ks, repeats), on_step)
    for attempt in range(1, COST_ATTEMPTS + 1):
        if attempt > 1:  # measured again: the phase grows by an attempt, and says so at once
            ticks.total = attempt * step_cost_units(ks, repeats)
            ticks.on_step(ticks.done, ticks.total)
        load = OtherLoad()
        costs = _step_costs(target, algorithm, draft, ks, context=context, repeats=repeats, tick=ticks)
        share = load.share()
        below = [k for k, v in costs["verify_cost"].items() if v < STEP_FLOOR]
        busy = under_load(share)
        costs.update(attempts=attempt, other_load=round(share, 3) if share is not None else None)
        if not below and not busy:
            return costs
    costs["label"] = (load_text(share) if busy else
                      f"implausible: verifying k + 1 tokens measured cheaper than one token for k = {below}")
    return costs


def _step_costs(target, algorithm, draft, ks: Sequence[int], *, context: Sequence[int],
                repeats: int, tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """The costs once: medians over `repeats`, every shape timed once per round so that load which comes and goes
    weighs on all alike."""
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams

    ks = sorted(set(int(k) for k in ks))
    with_aux = TargetRunner(target, algorithm.aux_layer_ids(draft))
    with_aux.reset()
    logits, aux = with_aux.forward(list(context), all_logits=False)  # prefill: the features the draft starts from
    first, params = int(logits[-1].argmax()), SamplingParams()
    propose_s: dict[int, list[float]] = {k: [] for k in ks}

    def propose_each_k() -> None:
        for k in ks:
            proposer = algorithm.proposer(draft)
            proposer.start(list(context), aux, first)
            t = time.perf_counter()
            proposer.propose(k, params, None)
            propose_s[k].append(time.perf_counter() - t)

    # the target over n new tokens, as a verification (n = 1: a baseline step), and the proposals, per round
    forward_s = time_forwards_round_robin(TargetRunner(target), list(context), sorted({1, *(k + 1 for k in ks)}),
                                          repeats, also=propose_each_k, tick=tick)
    one_s = statistics.median(forward_s[1])
    return {"verify_cost": {k: statistics.median(forward_s[k + 1]) / one_s for k in ks},
            "draft_cost": {k: statistics.median(propose_s[k]) / one_s for k in ks},
            "target_step_ms": one_s * 1e3, "context_tokens": len(context)}


def forecast(result: dict[str, Any], costs: dict[str, Any]) -> dict[str, Any]:
    """Speedup for each k = tokens per step / (verification + drafting), in single-token target steps.

    A baseline step commits one token at cost 1; a speculative step commits the mean acceptance length at cost
    v(k+1) + c_draft(k) (the rest of the loop is ignored)."""
    rows = {}
    varying = bool((result.get("proposer") or {}).get("p_min")) or \
        (result.get("proposer") or {}).get("method") == "draft_ngram"
    for key, acc in result["by_k"].items():
        k = int(key)
        tau = acc["mean_acceptance_length"]
        if varying and acc.get("step_shapes"):  # steps draft (and compute) fewer tokens where a cut or the n-gram acts
            rows[key] = _varying_step_row(acc, costs)
            continue
        v, c = costs["verify_cost"].get(k), costs["draft_cost"].get(k)
        rows[key] = {"mean_acceptance_length": tau, "verify_cost": v, "draft_cost": c,
                     "step_cost": (v + c) if v is not None and c is not None else None,
                     "speedup": tau / (v + c) if tau and v is not None and c is not None else None}
    best = max(rows, key=lambda key: rows[key]["speedup"] or 0.0)
    pays = (rows[best]["speedup"] or 0.0) > 1.0
    # no k is recommended when even the fastest forecasts a slowdown: decoding without this draft is faster here
    trusted = not costs.get("label")
    return {"by_k": rows, "fastest_k": int(best), "recommended_k": int(best) if pays and trusted else None,
            "target_step_ms": costs["target_step_ms"], **({"label": costs["label"]} if not trusted else {})}


def _varying_step_row(acc: dict[str, Any], costs: dict[str, Any]) -> dict[str, Any]:
    """A forecast row when steps differ: the mean over the walk's steps of v(d + 1) + c(computed) (0 for an n-gram
    step, v(1) = 1 for a step that drafts nothing), against the tokens one step commits."""
    verify = {0: 1.0, **{int(k): v for k, v in costs["verify_cost"].items()}}
    draft = {0: 0.0, **{int(k): c for k, c in costs["draft_cost"].items()}}
    total = steps = 0.0
    for drafted, computed, by_ngram, n in acc["step_shapes"]:
        v, c = verify.get(drafted), 0.0 if by_ngram else draft.get(computed)
        if v is None or c is None:  # a shape whose cost was not timed: no forecast rather than a guess
            return {"mean_acceptance_length": acc["mean_acceptance_length"], "verify_cost": None, "draft_cost": None,
                    "step_cost": None, "speedup": None}
        total, steps = total + n * (v + c), steps + n
    step = total / steps
    per_step = acc["tokens_per_step"]
    return {"mean_acceptance_length": acc["mean_acceptance_length"], "tokens_per_step": per_step,
            "verify_cost": None, "draft_cost": None, "step_cost": step, "speedup": per_step / step}


def measured_recommendation(sweep: list[dict[str, Any]], fc: dict[str, Any] | None = None, *,
                            ngram: float | None = None, where: str = "on this machine") -> str:
    """The recommended k is the best measured one of a k sweep (rows with k and speedup), with the forecast beside it
    and its error; no draft (1×) and n-gram (`ngram`, its measured speedup) are candidates too. Without measured
    rows: the forecast's advice (`recommendation`)."""
    rows = [r for r in sweep if r.get("speedup")]
    if not rows:
        return recommendation(fc, where)
    best = max(rows, key=lambda r: r["speedup"])
    k, measured = best["k"], best["speedup"]
    ci = (best.get("spread") or {}).get("ci95")
    interval = f", 95% interval {ci[0]:.2f}–{ci[1]:.2f}" if ci else ""
    single = "; single runs, no spread recorded" if not any((r.get("spread") or {}).get("ci95") for r in rows) else ""
    # other k whose interval reaches the best one's: the measurement cannot tell them apart
    close = [r["k"] for r in rows
             if r is not best and ci and ((r.get("spread") or {}).get("ci95") or [0, 0])[1] >= ci[0]]
    tie = f"; k = {', '.join(map(str, close))} within its interval" if close else ""
    if ngram is not None and ngram > max(measured, 1.0):
        return (f"the n-gram proposer measured faster {where} ({ngram:.2f}× against {measured:.2f}×{interval}"
                f"{',' if ci else ''} for this draft's best k, {k}{single})")
    if measured <= 1.0:
        return (f"no speculation with this draft: every measured k is slower than the target alone {where} (best: "
                f"k = {k} at {measured:.2f}×{interval}{single})")
    f = ((fc or {}).get("by_k", {}).get(str(k)) or {}).get("speedup")
    beside = f"; forecast {f:.2f}×, off by {f - measured:+.2f}" if f else ""
    return (f"recommended k {where}: {k} (measured {measured:.2f}×{interval}, the best of the k sweep"
            f"{tie}{beside}{single})")


def recommendation(fc: dict[str, Any] | None, where: str = "on this machine") -> str:
    """The forecast's advice in words: the k to use, or that speculating with this draft is slower (`where`: the
    machine whose costs the forecast used)."""
    if not fc or not fc.get("by_k"):
        return ""
    if fc.get("label"):
        return (f"no advice from this forecast: its step costs were measured {fc['label']}; evaluate again on a "
                "quiet machine")
    fastest = str(fc.get("fastest_k") or max(fc["by_k"], key=lambda key: fc["by_k"][key].get("speedup") or 0.0))
    best = fc["by_k"].get(fastest, {}).get("speedup")
    if best is not None and best > 1.0:
        return f"recommended k {where}: {fastest} (forecast {best:.2f}×)"
    return (f"no speculation with this draft: every k forecasts slower than the target alone {where}"
            + (f" (best: k = {fastest} at {best:.2f}×)" if best is not None else "")
            + "; decode without it, or try the n-gram proposer")
