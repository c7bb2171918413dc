"""N-gram prompt lookup: propose the tokens that followed the longest earlier match of the current suffix."""

from __future__ import annotations

import torch

from engine.generate.proposers import Proposal, Proposer
from engine.generate.sampling import SamplingParams


def ngram_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """vLLM's `prompt_lookup_min/max` rule: the longest suffix n-gram (min_n <= n <= max_n) that occurs
    earlier in `tokens`; among equally long matches the earliest; propose up to k following tokens."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n:]
        for start in range(0, size - n):  # earliest occurrence first; must end before the suffix itself
            if tokens[start:start + n] == suffix:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, prompt_lookup_min: int = 2, prompt_lookup_max: int = 5):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.tokens: list[int] = []

    def start(self, prompt_ids, prompt_aux, first_token):
        self.tokens = list(prompt_ids) + [first_token]

    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        return Proposal(ngram_lookup(self.tokens, k, self.min_n, self.max_n))

    def update(self, accepted, next_token, aux):
        self.tokens.extend(accepted)
        self.tokens.append(next_token)
