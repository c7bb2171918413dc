"""Why a speculative answer was fast or slow: acceptance, the time split of a step, the cost curve's ceiling.

`profile(events)` sums one generation's step events; `explain(profiles, ...)` sets every proposer's profile
against the baseline's and words the verdict: how many tokens a step emits, what a step costs in baseline
steps on this machine, where that time goes (target verification, drafting, the rest), and the speedup the
target's cost curve allows for this acceptance if drafting were free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.generate.events import StepEvent
from engine.generate.metrics import SpecMetrics, speedup_ceiling

SHORT_ANSWER_TOKENS = 32  # below this a speedup is a rough indication, not a measurement


@dataclass
class Profile:
    """One generation summed over its decode steps (the prefill step excluded)."""

    tokens: int = 0            # tokens emitted by the decode steps
    steps: int = 0             # decode steps (target forwards after the prefill)
    drafted_steps: int = 0     # decode steps that verified >= 1 draft token
    decode_s: float = 0.0      # compute time of the decode steps
    target_s: float = 0.0      # target forwards (verification) alone
    draft_s: float = 0.0       # proposer time
    prefill_s: float = 0.0
    mean_acceptance_length: float | None = None
    per_position_acceptance: list[float] = field(default_factory=list)

    @property
    def rest_s(self) -> float:
        """Acceptance, cache rollback, proposer updates, bookkeeping."""
        return max(0.0, self.decode_s - self.target_s - self.draft_s)

    @property
    def seconds_per_step(self) -> float | None:
        return self.decode_s / self.steps if self.steps else None

    @property
    def tokens_per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rest_s": self.rest_s}


def profile(events: Iterable[StepEvent]) -> Profile:
    out, metrics = Profile(), SpecMetrics()
    for e in events:
        metrics.observe(e)
        if e.step == 0:
            out.prefill_s += e.step_s
            continue
        out.tokens += len(e.tokens)
        out.steps += 1
        out.decode_s += e.step_s
        out.target_s += e.target_s
        out.draft_s += e.draft_s
    out.drafted_steps = metrics.num_drafts
    out.mean_acceptance_length = metrics.mean_acceptance_length
    out.per_position_acceptance = metrics.per_position_acceptance
    return out


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def explain(profiles: Mapping[str, Profile], *, k: int, cost_curve: Mapping[int, float] | None = None,
            labels: Mapping[str, str] | None = None, baseline: str = "baseline",
            short_tokens: int = SHORT_ANSWER_TOKENS) -> dict[str, dict[str, Any]]:
    """For every proposer in `profiles` (all but `baseline`): the numbers and a plain sentence.

    `cost_curve` maps n new tokens -> cost of one target forward over n tokens in units of a one-token forward
    (engine.generate.metrics.measure_cost_curve). Speedup here = baseline seconds per token / this one's.
    """
    labels = dict(labels or {})
    base = profiles.get(baseline)
    base_step = base.seconds_per_step if base else None
    verify_cost = (cost_curve or {}).get(k + 1)
    out: dict[str, dict[str, Any]] = {}
    for name, p in profiles.items():
        if name == baseline:
            continue
        label = labels.get(name, name)
        row: dict[str, Any] = {
            "label": label, "tokens": p.tokens + 1, "steps": p.steps,
            "mean_acceptance_length": p.mean_acceptance_length, "tokens_per_step": p.tokens_per_step,
            "per_position_acceptance": p.per_position_acceptance,
            "target_share": _share(p.target_s, p.decode_s), "draft_share": _share(p.draft_s, p.decode_s),
            "rest_share": _share(p.rest_s, p.decode_s),
            "step_cost": None, "target_cost": None, "draft_cost": None, "rest_cost": None, "speedup": None,
            "ceiling": speedup_ceiling(p.tokens, p.steps, p.drafted_steps, verify_cost) if verify_cost else None,
            "verify_cost": verify_cost,
            "short": p.tokens + 1 < short_tokens,
        }
        if base_step and p.steps:
            per_step = p.decode_s / p.steps
            row.update(step_cost=per_step / base_step, target_cost=p.target_s / p.steps / base_step,
                       draft_cost=p.draft_s / p.steps / base_step, rest_cost=p.rest_s / p.steps / base_step)
            if p.tokens and base.tokens:
                row["speedup"] = (base.decode_s / base.tokens) / (p.decode_s / p.tokens)
        out[name] = row
    for name, row in out.items():
        row["sentence"] = _sentence(row, {n: r for n, r in out.items() if n != name})
    return out


def _sentence(row: dict[str, Any], others: Mapping[str, dict[str, Any]]) -> str:
    label, tau, cost, speedup = row["label"], row["tokens_per_step"], row["step_cost"], row["speedup"]
    if tau is None or cost is None or speedup is None:
        return f"{label}: too few steps to judge."
    mal = row["mean_acceptance_length"]
    # the same quantity names as the answer's footer: "mean acceptance length" (vLLM's, over drafted steps)
    when = f" (mean acceptance length {mal:.2f} on the steps it drafted)" if mal is not None and abs(mal - tau) >= 0.2 \
        else ""
    head = f"{label} emits {tau:.1f} tokens per step{when}; a step costs {cost:.1f} baseline steps on this machine"
    parts = []
    if row["target_cost"] is not None:
        parts.append(f"target verification {row['target_cost']:.1f}")
        if row["draft_cost"] >= 0.05:
            parts.append(f"drafting {row['draft_cost']:.1f}")
        if row["rest_cost"] >= 0.05:
            parts.append(f"the rest {row['rest_cost']:.1f}")
    head += f" ({', '.join(parts)})" if parts else ""
    rough = " (a short answer: a rough indication)" if row["short"] else ""
    if speedup >= 1.0:
        return f"{head}: {speedup:.2f}× faster{rough}."
    better = [r for r in others.values() if r["tokens_per_step"] and r["tokens_per_step"] > tau]
    why = []
    if row["ceiling"] is not None and row["ceiling"] < 1.0:
        why.append(f"even with free drafting this acceptance could give at most {row['ceiling']:.2f}× "
                   f"(verifying {row['verify_cost']:.1f}× the cost of one token)")
    elif row["target_cost"] is not None and row["target_cost"] >= tau:
        why.append(f"verifying a step alone costs {row['target_cost']:.1f} baseline steps, more than the "
                   f"{tau:.1f} tokens it yields")
    elif row["draft_cost"] is not None and row["draft_cost"] >= 0.05:
        why.append(f"drafting ({row['draft_cost']:.1f} baseline steps per step) tips the balance")
    text = f"{head}, so speculation loses here: {speedup:.2f}×{rough}"
    if why:
        text += "; " + why[0]
    if better:
        best = max(better, key=lambda r: r["tokens_per_step"])
        text += f"; {best['label']} emits {best['tokens_per_step']:.1f} here"
    return text + "."
