"""Turning logits into probabilities and tokens: temperature, top-k, top-p, seeded sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.errors import WorkbenchError


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class SamplingParams:
    """How to pick tokens. temperature 0 = greedy. The same processing is applied to the target in
    baseline and speculative mode, so both sample from the same distribution."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = 0
    stop: list[str] = field(default_factory=list)  # stop strings (output is cut before them)
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse values that would crash sampling or silently mean something else (e.g. greedy)."""
        checks = [
            ("temperature", self.temperature, _finite(self.temperature) and self.temperature >= 0,
             "0 for greedy decoding, or a positive value such as 0.7 (--temperature)"),
            ("top_p", self.top_p, _finite(self.top_p) and 0 < self.top_p <= 1,
             "a value in (0, 1]; 1 keeps every token (--top-p)"),
            ("top_k", self.top_k, isinstance(self.top_k, int) and self.top_k >= 0,
             "0 for no top-k cut, or a positive whole number (--top-k)"),
            ("max_new_tokens", self.max_new_tokens, isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
             "a positive whole number (--max-new-tokens)"),
        ]
        for name, value, good, hint in checks:
            if not good:
                raise WorkbenchError(f"invalid sampling parameter {name}={value!r}", hint=f"{name} must be {hint}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (fp32) after temperature, top-k and top-p."""
    logits = logits.float() / max(params.temperature, 1e-5)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop tokens once the mass before them already reaches top_p (always keep the first)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Greedy argmax or a sample from the processed distribution, for logits [V]."""
    if params.greedy:
        return int(torch.argmax(logits))
    return sample(logits_to_probs(logits, params), generator)
