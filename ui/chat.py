"""Baseline and speculative generation of one prompt, interleaved so both answers stream side by side.

Each side is advanced in turn by whichever has used less of its own compute time, so both appear at the pace
they would have alone; tokens/s and the speedup use each side's own time only (display time excluded).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.generate.events import StepEvent
from engine.generate.metrics import SpecMetrics
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate
from ui.tokens import TokenMark, TokenText


@dataclass
class Side:
    """One answer being generated: its events, token marks, own compute time and acceptance metrics."""

    name: str
    text: TokenText
    marks: list[TokenMark] = field(default_factory=list)
    events: list[StepEvent] = field(default_factory=list)
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
    own_s: float = 0.0
    first_s: float | None = None  # own time until the first token (prefill)
    done: bool = False
    finished: str | None = None

    def add(self, event: StepEvent) -> None:
        self.events.append(event)
        self.metrics.observe(event)
        rejected = [self.text.tokenizer.decode([t], skip_special_tokens=False) for t in event.rejected]
        for i, (tok, src) in enumerate(zip(event.tokens, event.sources)):
            last = i == len(event.tokens) - 1
            self.marks.append(TokenMark(self.text.add(tok), src, event.step, rejected if last else []))
        if event.finished:
            self.finished = event.finished

    @property
    def ids(self) -> list[int]:
        return self.text.ids

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first one over the time after the prefill (like vLLM's ITL-based rate)."""
        decode_s = self.own_s - (self.first_s or 0.0)
        if len(self.ids) > 1 and decode_s > 0:
            return (len(self.ids) - 1) / decode_s
        return len(self.ids) / self.own_s if self.own_s > 0 else 0.0

    def step_lengths(self) -> list[int]:
        """Tokens emitted per verification step (the acceptance length of that step), prefill excluded."""
        return [len(e.tokens) for e in self.events if e.step > 0]

    def step_rows(self) -> list[dict]:
        tok = self.text.tokenizer
        return [{"step": e.step, "emitted": tok.decode(e.tokens, skip_special_tokens=False),
                 "sources": " ".join(e.sources), "accepted/drafted": f"{e.accepted}/{e.drafted}",
                 "rejected drafts": " ".join(repr(tok.decode([t], skip_special_tokens=False)) for t in e.rejected)}
                for e in self.events]

    def summary(self) -> dict:
        return {"tokens": len(self.ids), "seconds": round(self.own_s, 3), "tokens_per_s": self.tokens_per_s,
                "first_token_s": self.first_s,
                "mean_acceptance_length": self.metrics.mean_acceptance_length,
                "per_position_acceptance": self.metrics.per_position_acceptance, "finished": self.finished}


def race(target, prompt_ids: list[int], params: SamplingParams, proposer, k: int,
         on_event: Callable[[Side], None] | None = None) -> tuple[Side, Side]:
    """Generate the baseline and the speculative answer of one prompt, interleaved; returns (baseline, spec)."""
    tok = target.tokenizer
    base = Side("baseline", TokenText(tok))
    spec = Side("speculative", TokenText(tok))
    gens = {
        "baseline": generate(TargetRunner(target), prompt_ids, params, None, k),
        "speculative": generate(TargetRunner(target, getattr(proposer, "aux_layer_ids", None)), prompt_ids, params,
                                proposer, k),
    }
    while not (base.done and spec.done):
        side = min((s for s in (base, spec) if not s.done), key=lambda s: s.own_s)
        t0 = time.perf_counter()
        try:
            event = next(gens[side.name])
        except StopIteration:
            side.done = True
            event = None
        side.own_s += time.perf_counter() - t0
        if event is not None:
            if side.first_s is None:
                side.first_s = side.own_s
            side.add(event)
        if on_event is not None:
            on_event(side)
    return base, spec


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat-templated token ids of a conversation (engine.generate.api.prompt_ids)."""
    from engine.generate.api import prompt_ids as engine_prompt_ids

    return engine_prompt_ids(tokenizer, messages)


def sampling(tokenizer, *, max_new_tokens: int, temperature: float, seed: int) -> SamplingParams:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, eos_token_ids=eos)
