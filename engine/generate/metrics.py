"""Acceptance metrics with vLLM's definitions, and the target's cost curve with the speedup ceiling it implies."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from engine.generate.events import StepEvent


@dataclass
class SpecMetrics:
    """Counters like vLLM's Prometheus ones: a draft = one step that verified >= 1 draft token."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    # steps that drafted position i: fewer than num_drafts where a step drafted less than k (the draft never runs
    # past max_new_tokens, vLLM's does)
    drafted_per_pos: list[int] = field(default_factory=list)
    num_tokens: int = 0       # generated tokens (prefill token included)
    decode_steps: int = 0     # target forwards after the prefill, drafted or not
    decode_tokens: int = 0    # tokens those steps emitted (1 where nothing was drafted)
    decode_seconds: float = 0.0  # time after the first token
    total_seconds: float = 0.0

    def observe(self, event: StepEvent) -> None:
        self.num_tokens += len(event.tokens)
        if event.step == 0:
            self._t_first = event.elapsed_s
        self.total_seconds = event.elapsed_s
        self.decode_seconds = event.elapsed_s - getattr(self, "_t_first", 0.0)
        if event.step > 0:
            self.decode_steps += 1
            self.decode_tokens += len(event.tokens)
        if event.drafted:
            self.num_drafts += 1
            self.num_draft_tokens += event.drafted
            self.num_accepted_tokens += event.accepted
            while len(self.accepted_per_pos) < event.drafted:
                self.accepted_per_pos.append(0)
                self.drafted_per_pos.append(0)
            for i in range(event.accepted):
                self.accepted_per_pos[i] += 1
            for i in range(event.drafted):
                self.drafted_per_pos[i] += 1

    def merge(self, other: SpecMetrics) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        while len(self.accepted_per_pos) < len(other.accepted_per_pos):
            self.accepted_per_pos.append(0)
            self.drafted_per_pos.append(0)
        for i, n in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[i] += n
        for i, n in enumerate(other.drafted_per_pos):
            self.drafted_per_pos[i] += n
        self.num_tokens += other.num_tokens
        self.decode_steps += other.decode_steps
        self.decode_tokens += other.decode_tokens
        self.decode_seconds += other.decode_seconds
        self.total_seconds += other.total_seconds

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts (bonus token included), as vLLM reports it."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def per_position_acceptance(self) -> list[float]:
        """accepted_per_pos[i] / drafts: P(the first i+1 drafts are all accepted)."""
        return [n / self.num_drafts for n in self.accepted_per_pos] if self.num_drafts else []

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.total_seconds if self.total_seconds else 0.0

    def to_dict(self) -> dict:
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens, "accepted_per_pos": self.accepted_per_pos,
            "drafted_per_pos": self.drafted_per_pos,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": self.per_position_acceptance, "acceptance_rate": self.acceptance_rate,
            "num_tokens": self.num_tokens, "tokens_per_s": self.tokens_per_s, "seconds": self.total_seconds,
        }


def time_forwards_round_robin(runner, context: list[int], shapes: list[int], repeats: int,
                              also=None, tick=None) -> dict[int, list[float]]:
    """Seconds of one target forward over n new tokens after `context`, for each n in `shapes`, `repeats` times.

    Round-robin, one of each shape per repeat (then `also()`, e.g. the caller's draft proposal), so passing load
    weighs on every shape alike (repeats in a row let a busy second make 2 tokens look cheaper than 1). `tick()`
    follows each timing, for progress within the measurement."""
    runner.reset()
    runner.forward(context, all_logits=False)
    base = runner.length
    samples: dict[int, list[float]] = {n: [] for n in shapes}
    for _ in range(repeats):
        for n in shapes:
            t = time.perf_counter()
            runner.forward(context[-1:] * n)
            samples[n].append(time.perf_counter() - t)
            runner.crop(base)
            if tick is not None:
                tick()
        if also is not None:
            also()
            if tick is not None:
                tick()
    return samples


def measure_cost_curve(runner, context: list[int], ks: list[int], repeats: int = 5) -> dict[int, float]:
    """Median time of one target forward over k new tokens (after `context`), relative to k = 1 (round-robin)."""
    samples = time_forwards_round_robin(runner, context, sorted(set([1] + list(ks))), repeats)
    times = {k: statistics.median(v) for k, v in samples.items()}
    return {k: times[k] / times[1] for k in times}


def speedup_ceiling(tokens: int, steps: int, drafted_steps: int, verify_cost: float) -> float | None:
    """Speedup if drafting were free: tokens over ALL decode steps / their verification cost in one-token forwards."""
    # a drafted step verifies k+1 tokens (`verify_cost` = the cost curve at k+1); a step that drafted nothing emits
    # one token for one one-token forward, cost 1. The acceptance length of the drafted steps alone would overstate
    # a proposer that often proposes nothing (n-gram).
    if not steps or verify_cost <= 0:
        return None
    drafted = min(drafted_steps, steps)
    return tokens / (drafted * verify_cost + (steps - drafted))
