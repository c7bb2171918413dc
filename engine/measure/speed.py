"""One speed per k: the baseline, n-gram and the draft at every k decoded prompt by prompt in one interleaved run,
in rounds repeated until every speedup's 95% interval is narrow or the time budget ends."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.algos.loading import make_proposer
from engine.cpu import BUSY_SHARE, OtherLoad
from engine.generate.metrics import SpecMetrics
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.speculative import generate
from engine.jobs import reporter
from engine.measure.options import BenchOptions
from engine.measure.spread import acceptance_spread, mean_interval
from engine.measure.step_costs import STEP_FLOOR
from engine.provenance import provenance
from engine.targets.dtypes import dtype_name

log = logging.getLogger(__name__)

MIN_ROUNDS = 3          # the fewest rounds whose spread means something (a t interval over 2 is 12.7 sd wide)
GROUP_ATTEMPTS = 3      # one prompt's methods timed again at most this often while others load the CPUs


@dataclass
class Method:
    """One decoding method of the run: its proposer and k, and what each round measured."""

    name: str                       # "baseline", "ngram", "draft"
    k: int                          # 0 for the baseline
    proposer: Any = None
    runner: TargetRunner | None = None
    metrics: SpecMetrics | None = None                          # acceptance, from the first round
    per_prompt: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)           # per round: time over all prompts
    steps: int = 0                                               # target forwards over all prompts (one round)

    @property
    def key(self) -> str:
        return self.name if self.name == "baseline" else f"{self.name} k={self.k}"


def decode_one(method: Method, ids: list[int], params) -> tuple[list[int], SpecMetrics, int]:
    """One prompt with one method: output tokens, its counters and the target forwards it took."""
    metrics, out, steps = SpecMetrics(), [], 0
    for event in generate(method.runner, ids, params, method.proposer, method.k or 1):
        metrics.observe(event)
        out.extend(event.tokens)
        steps += 1
    return out, metrics, steps


def _prompt_group(methods: list[Method], ids: list[int], params, i: int
                  ) -> tuple[dict[str, tuple[list[int], SpecMetrics, int]], float | None]:
    """Every method on one prompt, their order rotated by the prompt's index `i` (so that none always runs first
    after a prompt change), timed again while other processes kept the CPUs busy (at most GROUP_ATTEMPTS times):
    ({method key: (output, counters, forwards)}, the other processes' CPU share during the kept timing)."""
    for _ in range(GROUP_ATTEMPTS):
        load, done = OtherLoad(), {}
        for m in methods[i % len(methods):] + methods[:i % len(methods)]:
            done[m.key] = decode_one(m, ids, params)
        share = load.share()
        if share is None or share <= BUSY_SHARE:
            break
    return done, share


def timed_round(methods: list[Method], encoded: list[list[int]], params, first: bool) -> dict[str, Any]:
    """Every method on every prompt, prompt by prompt; the first round also keeps outputs and acceptance. The
    round's load is the busiest prompt group's: a burst of other work weighs on the few methods it overlapped."""
    seconds, shares = {m.key: 0.0 for m in methods}, []
    for i, ids in enumerate(encoded):
        done, share = _prompt_group(methods, ids, params, i)
        shares.append(share)
        for m in methods:
            out, metrics, steps = done[m.key]
            seconds[m.key] += metrics.total_seconds
            if first:
                m.outputs.append(out)
                m.steps += steps
                if m.metrics is None:
                    m.metrics = SpecMetrics()
                m.metrics.merge(metrics)
                tau = metrics.mean_acceptance_length
                m.per_prompt.append({"tokens": len(out), "num_drafts": metrics.num_drafts,
                                     "mean_acceptance_length": round(tau, 4) if tau is not None else None})
    for m in methods:
        m.seconds.append(seconds[m.key])
    known = [x for x in shares if x is not None]
    return {"seconds": {key: round(s, 6) for key, s in seconds.items()},
            "other_load": round(max(known), 3) if known else None}


def _implausible(methods: list[Method], r: int) -> list[str]:
    """Methods whose step in round `r` cost less than a baseline step: only a load that changed within the round
    makes that happen."""
    base = methods[0]
    one = base.seconds[r] / max(1, base.steps)
    return [m.key for m in methods[1:] if m.steps and m.seconds[r] / m.steps < STEP_FLOOR * one]


def _speedups(methods: list[Method], kept: list[int]) -> dict[str, dict[str, Any]]:
    """Each method's speedup over the baseline of the same round (same prompts, same tokens), over kept rounds."""
    base = methods[0]
    return {m.key: mean_interval([base.seconds[r] / m.seconds[r] for r in kept]) for m in methods[1:]}


def _row(m: Method, base: Method, spread: dict[str, Any], kept: list[int]) -> dict[str, Any]:
    base_s = sum(base.seconds[r] for r in kept) / len(kept)
    own_s = sum(m.seconds[r] for r in kept) / len(kept)
    metrics = m.metrics
    tokens = sum(len(o) for o in m.outputs)
    row: dict[str, Any] = {
        "method": m.name, "k": m.k, "tokens": tokens, "tokens_per_s": tokens / own_s if own_s else None,
        "speedup": spread["mean"], "spread": {kk: spread[kk] for kk in ("n", "ci95", "half_width", "min", "max")},
        "step_cost": (own_s / m.steps) / (base_s / base.steps) if m.steps and base.steps else None,
        "identical_to_baseline": m.outputs == base.outputs}
    if m.name != "baseline":
        acc = acceptance_spread([p["mean_acceptance_length"] for p in m.per_prompt],
                                [p["num_drafts"] for p in m.per_prompt])
        row.update(mean_acceptance_length=metrics.mean_acceptance_length,
                   per_position_acceptance=metrics.per_position_acceptance,
                   acceptance_ci95=acc["ci95"], num_drafts=metrics.num_drafts,
                   num_accepted_tokens=metrics.num_accepted_tokens)
    return row


def _run_rounds(methods: list[Method], encoded: list[list[int]], params, options: BenchOptions
                ) -> tuple[list[dict[str, Any]], str]:
    """Rounds until every interval is within ±tolerance (at least MIN_ROUNDS clean ones), the budget would be passed
    by one more round, or max_rounds: (each round's record, why it stopped)."""
    budget_s, tolerance = options.budget_min * 60, options.tolerance
    rounds, start, stopped = [], time.perf_counter(), "max rounds"
    while len(rounds) < options.max_rounds:
        t0 = time.perf_counter()
        info = timed_round(methods, encoded, params, first=not rounds)
        r = len(rounds)
        odd = _implausible(methods, r)
        busy = info["other_load"] is not None and info["other_load"] > BUSY_SHARE
        info.update(clean=not odd and not busy, below_one_step=odd)
        rounds.append(info)
        kept = [i for i, x in enumerate(rounds) if x["clean"]]
        spreads = _speedups(methods, kept) if kept else {}
        log.info("round %d: %s%s", r + 1, ", ".join(f"{key} {s['mean']:.2f}×" for key, s in spreads.items()),
                 "" if info["clean"] else " (left out: " + ("under load" if busy else f"below one step: {odd}") + ")")
        elapsed, last = time.perf_counter() - start, time.perf_counter() - t0
        reporter().update(f"speed per k: round {r + 1}, {len(kept)} clean", min(1.0, elapsed / budget_s))
        if len(kept) >= MIN_ROUNDS and all(s["half_width"] is not None and s["half_width"] <= tolerance
                                           for s in spreads.values()):
            return rounds, f"every interval within ±{tolerance}"
        if elapsed + last > budget_s:
            return rounds, "time budget"
    return rounds, stopped


def _methods(target, options: BenchOptions) -> list[Method]:
    """The baseline first, n-gram at `options.k` where `methods` names it, then the draft at every k (one
    proposer); methods whose target layers agree share one runner."""
    methods = [Method("baseline", 0)]
    if "ngram" in options.method_names():
        methods.append(Method("ngram", options.k, make_proposer("ngram", target)))
    proposer = make_proposer("draft", target, draft=options.draft, p_min=options.p_min)
    methods += [Method("draft", k, proposer) for k in options.k_values()]
    runners: dict[Any, TargetRunner] = {}
    for m in methods:
        aux = getattr(m.proposer, "aux_layer_ids", None)
        m.runner = runners.setdefault(tuple(aux) if aux else None, TargetRunner(target, aux))
    return methods


def speed_per_k(target, prompts: list[dict[str, Any]], options: BenchOptions) -> dict[str, Any]:
    """Speedup of the draft at each of `options.ks` (and of n-gram at `options.k`) over the baseline, decoded in one
    interleaved run. Rounds repeat until each 95% interval is within ±`tolerance` (at least MIN_ROUNDS), the budget
    ends, or `max_rounds`. A round loaded by other processes (`_prompt_group` times such prompts again) or below
    the one-step floor is left out; with none clean, the result is labelled "under load"."""
    params = options.sampling()
    if not params.eos_token_ids and target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        params.eos_token_ids = [target.tokenizer.eos_token_id]
    methods = _methods(target, options)
    encoded = [prompt_ids(target.tokenizer, p) for p in prompts]
    warm = dataclasses.replace(params, max_new_tokens=min(8, params.max_new_tokens))
    for m in methods:  # one-time costs (weights packed, kernels primed) before any round is timed
        decode_one(m, encoded[0], warm)
    start = time.perf_counter()
    rounds, stopped = _run_rounds(methods, encoded, params, options)
    kept = [i for i, x in enumerate(rounds) if x["clean"]]
    label = None if kept else "under load: no round ran on a quiet machine; the figures are from loaded rounds"
    kept = kept or list(range(len(rounds)))
    spreads = _speedups(methods, kept)
    base = methods[0]
    rows = [_row(m, base, spreads[m.key], kept) for m in methods[1:]]
    base_s = sum(base.seconds[i] for i in kept) / len(kept)
    tokens = sum(len(o) for o in base.outputs)
    baseline = {"mean_acceptance_length": None, "per_position_acceptance": [], "tokens": tokens,
                "tokens_per_s": tokens / base_s if base_s else None, "speedup": 1.0, "identical_to_baseline": True}
    drafts = [r for r in rows if r["method"] == "draft"]
    ngram = next((r for r in rows if r["method"] == "ngram"), None)
    at_k = next((r for r in drafts if r["k"] == options.k), drafts[0])
    return {"rows": drafts, "k": at_k["k"],
            # bench's shape at --k (the draft at that k, n-gram, baseline): pages that read a bench read this too
            "methods": {"baseline": baseline, "draft": at_k, **({"ngram": ngram} if ngram else {})},
            "rounds": rounds, "rounds_kept": len(kept), "stopped": stopped, "label": label,
            "tolerance": options.tolerance, "budget_s": options.budget_min * 60,
            "seconds": round(time.perf_counter() - start, 1),
            "num_prompts": len(prompts), "max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
            "seed": params.seed, "measured_by": "interleaved rounds (engine.measure.speed)",
            "target": target.ref.name, "draft": str(options.draft) if options.draft else None,
            "backend": "transformers", "target_dtype": dtype_name(target.dtype), "kernel": target.extra.get("kernel"),
            "threads": torch.get_num_threads(), **provenance(dtype_name(target.dtype))}


def speed_lines(result: dict[str, Any]) -> list[str]:
    """The result as a markdown table: one speed per k with its interval over rounds, beside its acceptance."""
    def interval(row):
        ci = (row.get("spread") or {}).get("ci95")
        return f"{row['speedup']:.2f}× ({ci[0]:.2f}–{ci[1]:.2f})" if ci else f"{row['speedup']:.2f}× (one round)"

    def tau(row):
        ci = row.get("acceptance_ci95")
        t = row.get("mean_acceptance_length")
        return "–" if t is None else f"{t:.2f}" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "")

    ngram = result["methods"].get("ngram")
    rows = [*result["rows"], *([ngram] if ngram else [])]
    lines = ["| method | k | mean acceptance length | speedup (95% interval over rounds) | tokens/s | step cost | "
             "identical |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['k']} | {tau(r)} | {interval(r)} | {r['tokens_per_s']:.1f} | "
                     f"{r['step_cost']:.2f} | {'yes' if r['identical_to_baseline'] else 'no'} |")
    base = result["methods"]["baseline"]
    lines += ["", f"Baseline {base['tokens_per_s']:.1f} tokens/s. {result['rounds_kept']} of {len(result['rounds'])} "
              f"rounds kept (stopped: {result['stopped']}); step cost = a speculative step's time in baseline steps."]
    if result.get("label"):
        lines.append(result["label"])
    return lines


__all__ = ["BUSY_SHARE", "MIN_ROUNDS", "Method", "decode_one", "speed_lines", "speed_per_k", "timed_round"]
