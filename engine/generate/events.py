"""The event every generation step yields: tokens with their source, rejected drafts, timing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

TARGET = "target"          # produced by the target alone (baseline, or the first token after prefill)
ACCEPTED = "accepted"      # a draft token the target accepted
CORRECTION = "correction"  # the target's token at the first rejected position
BONUS = "bonus"            # the target's extra token when every draft token was accepted


@dataclass
class StepEvent:
    step: int
    tokens: list[int]
    sources: list[str]
    rejected: list[int] = field(default_factory=list)
    drafted: int = 0          # draft tokens verified in this step
    accepted: int = 0         # of which accepted
    elapsed_s: float = 0.0    # since generation started (includes time the consumer paused the generator)
    step_s: float = 0.0       # compute time of this step alone
    draft_s: float = 0.0      # proposer time (draft forwards)
    verify_s: float = 0.0     # target forward + acceptance + cache rollback
    target_s: float = 0.0     # the target forward alone
    text: str = ""            # decoded text of `tokens` (filled when a tokenizer is given)
    finished: str | None = None  # "eos" | "stop" | "length" on the last event
    withheld: int = 0         # drafted but cut before verification by the proposer (decided before verifying)
    confidence: list[float] = field(default_factory=list)  # the proposer's survival estimate per drafted token

    def to_dict(self) -> dict:
        return asdict(self)
