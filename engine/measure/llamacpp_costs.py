"""What a speculative step costs in llama.cpp, in baseline tokens, and the speedup it forecasts from an acceptance."""

# A baseline step of llama-server commits one token in t1 ms; a speculative step at k (the draft's k tokens and the
# target's check of k + 1) takes c(k) ms and commits tau tokens. So the speedup is tau * t1 / c(k): tau from the
# decoding-exact evaluator, t1 and c(k) measured here on a few calibration prompts (their own acceptance does not enter
# c(k), which is per verification step). Every step drafts unless a threshold (p_min) stops it; then c(k) is not fixed.

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from engine.llamacpp.build import ensure_llamacpp
from engine.llamacpp.gguf import DEFAULT_DRAFT_TYPE, DEFAULT_TARGET_TYPE, export_draft, target_gguf
from engine.llamacpp.server import LlamaAnswer, LlamaPlan, LlamaServer

log = logging.getLogger(__name__)

CALIBRATION_TOKENS = 128  # the length of a benchmark's answers (at most)
CALIBRATION_PROMPTS = 6


def llamacpp_step_costs(draft: str, target_dir: str, ks: Sequence[int], prompts: Sequence[list[int]], *,
                        gguf_target: str = DEFAULT_TARGET_TYPE, gguf_draft: str = DEFAULT_DRAFT_TYPE,
                        threads: int | None = None, tokens: int = CALIBRATION_TOKENS) -> dict[str, Any]:
    """t1 (ms per baseline token) and c(k) (ms per drafted step) in llama-server on `prompts`: the baseline and one
    server per k all started first, then each prompt sent to each in turn (as the benchmark does), so that a drift of
    the machine's speed weighs on all alike."""
    build = ensure_llamacpp()
    tgt = target_gguf(target_dir, outtype=gguf_target, build=build)
    exported = export_draft(draft, target=target_dir, outtype=gguf_draft, build=build)
    plans = {"baseline": LlamaPlan(tgt), **{str(k): LlamaPlan(tgt, exported.path, (exported.spec_type,), k=k)
                                            for k in ks}}
    answers = _interleaved(plans, prompts, tokens, threads, build)
    t1 = _ms_per_token(answers["baseline"])
    steps = {}
    for k in (str(k) for k in ks):
        drafted = sum(a.draft_steps for a in answers[k])
        steps[k] = sum(a.predicted_ms for a in answers[k]) / drafted if drafted else None
    return {"engine": "llama.cpp", "target_step_ms": t1, "step_ms": steps,
            "step_cost": {k: (c / t1 if c else None) for k, c in steps.items()},
            "gguf_target": gguf_target, "gguf_draft": gguf_draft, "spec_type": exported.spec_type,
            "calibration_prompts": len(prompts), "calibration_tokens": tokens, "llama_cpp_version": build.version}


def forecast_llamacpp(by_k: dict[str, dict[str, Any]], costs: dict[str, Any]) -> dict[str, Any]:
    """Speedup per k = tau / c(k) in baseline tokens; the fastest k, and whether any k pays."""
    rows = {}
    for key, acc in by_k.items():
        tau, cost = acc.get("mean_acceptance_length"), costs["step_cost"].get(key)
        rows[key] = {"mean_acceptance_length": tau, "step_cost": cost,
                     "speedup": tau / cost if tau and cost else None}
    fastest = max(rows, key=lambda key: rows[key]["speedup"] or 0.0) if rows else None
    pays = bool(fastest) and (rows[fastest]["speedup"] or 0.0) > 1.0
    return {"engine": "llama.cpp", "by_k": rows, "fastest_k": int(fastest) if fastest else None,
            "recommended_k": int(fastest) if pays else None, "target_step_ms": costs["target_step_ms"],
            "advice": advice(rows, pays)}


def advice(rows: dict[str, dict[str, Any]], pays: bool) -> str:
    """What pays in llama.cpp, from the forecast: the fastest k, or no draft, with the break-even acceptance."""
    known = {key: row for key, row in rows.items() if row["speedup"]}
    if not known:
        return "no forecast: llama.cpp verified no draft of this one on the calibration prompts"
    best = max(known, key=lambda key: known[key]["speedup"])
    row = known[best]
    if pays:
        return f"serve with k = {best}: forecast {row['speedup']:.2f}× in llama.cpp"
    need = row["step_cost"]
    return (f"no k pays in llama.cpp here: at best {row['speedup']:.2f}× (k = {best}); a step costs "
            f"{need:.2f} baseline tokens, so the draft must accept τ ≥ {need:.2f} to break even (it accepts "
            f"{row['mean_acceptance_length']:.2f}). Serve without this draft, or with an n-gram proposer")


def _interleaved(plans: dict[str, LlamaPlan], prompts: Sequence[list[int]], tokens: int, threads: int | None,
                 build) -> dict[str, list[LlamaAnswer]]:
    servers = {name: LlamaServer(plan, threads=threads, build=build) for name, plan in plans.items()}
    try:
        for server in servers.values():
            server.start().wait_ready()
            server.client().complete(prompts[0][:8], max_tokens=4, counters=False)  # warm-up, untimed
        out: dict[str, list[LlamaAnswer]] = {name: [] for name in servers}
        for ids in prompts:
            for name, server in servers.items():
                out[name].append(server.client().complete(ids, max_tokens=tokens))
        return out
    finally:
        for server in servers.values():
            server.stop()


def _ms_per_token(answers: Sequence[LlamaAnswer]) -> float:
    """Decode ms per token after the first (which the prompt's pass samples)."""
    return sum(a.predicted_ms for a in answers) / max(1, sum(max(0, a.tokens - 1) for a in answers))
