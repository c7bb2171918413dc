"""N-gram prompt lookup, alone or beside a draft: propose the tokens that followed the longest earlier match of the
current suffix."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from engine.generate.proposers import Proposal, Proposer
from engine.generate.sampling import SamplingParams

# draft_ngram: the n-gram's proposal is taken when its matched suffix is at least this long; 2 (every match the
# n-gram makes) forecast and decoded fastest on general and ShareGPT prompts (benchmarks/results/levers/)
NGRAM_MIN_MATCH = 2


def ngram_match(tokens: Sequence[int], min_n: int, max_n: int) -> tuple[int, int]:
    """vLLM's `prompt_lookup_min/max` rule: (n, start) of the longest suffix n-gram (min_n <= n <= max_n) that occurs
    earlier in `tokens`, the earliest among equally long ones (what follows it starts at start + n); (0, 0) if none."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = list(tokens[size - n:])
        for start in range(0, size - n):  # earliest occurrence first; must end before the suffix itself
            if list(tokens[start:start + n]) == suffix:
                return n, start
    return 0, 0


def ngram_lookup(tokens: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the match `ngram_match` finds (none without a match)."""
    n, start = ngram_match(tokens, min_n, max_n)
    return list(tokens[start + n:start + n + k]) if n else []


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, prompt_lookup_min: int = 2, prompt_lookup_max: int = 5):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.tokens: list[int] = []

    def start(self, prompt_ids, prompt_aux, first_token):
        self.tokens = list(prompt_ids) + [first_token]

    def match(self) -> tuple[int, int]:
        """(n, start) of the current suffix's match (`ngram_match`)."""
        return ngram_match(self.tokens, self.min_n, self.max_n)

    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        return Proposal(ngram_lookup(self.tokens, k, self.min_n, self.max_n))

    def update(self, accepted, next_token, aux):
        self.tokens.extend(accepted)
        self.tokens.append(next_token)


class DraftNgramProposer(Proposer):
    """Per step, the n-gram's proposal when its matched suffix has at least `min_match` tokens, else the draft's
    (Arctic Inference's rule for its own speculator). The draft reads every verified position either way."""

    name = "draft_ngram"

    def __init__(self, draft: Proposer, ngram: NgramProposer, min_match: int = NGRAM_MIN_MATCH):
        if min_match < ngram.min_n:
            raise ValueError(f"min_match {min_match} is below the n-gram's shortest match {ngram.min_n}")
        self.draft, self.ngram, self.min_match = draft, ngram, min_match
        self.aux_layer_ids = draft.aux_layer_ids
        self.last_source: str | None = None  # "ngram" or "draft": who proposed the last step

    def start(self, prompt_ids, prompt_aux, first_token):
        self.draft.start(prompt_ids, prompt_aux, first_token)
        self.ngram.start(prompt_ids, prompt_aux, first_token)

    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        n, start = self.ngram.match()
        if n >= self.min_match and k >= 1:
            self.last_source = "ngram"
            return Proposal(self.ngram.tokens[start + n:start + n + k])
        self.last_source = "draft"
        return self.draft.propose(k, params, generator)

    def update(self, accepted, next_token, aux):
        self.draft.update(accepted, next_token, aux)
        self.ngram.update(accepted, next_token, aux)


def draft_ngram_counts(token_ids: Sequence[int], a: Sequence[int], cuts: Sequence[int] | None, k: int, *,
                       min_match: int = NGRAM_MIN_MATCH, min_n: int = 2,
                       max_n: int = 5) -> tuple[list[int], list[int], list[bool]]:
    """The evaluator's view of DraftNgramProposer on a greedy held-out sequence token_ids [T]: per state q (token q the
    last committed), (accepted a_h[q], drafted cap cuts_h[q], by the n-gram) of the n-gram where its match is long
    enough, else the draft's `a` and `cuts` (None: k). Exact: the committed text at state q is the data's 0..q."""
    tokens = tuple(int(t) for t in token_ids)
    a_h = [int(x) for x in a]
    cuts_h = [k] * len(a_h) if cuts is None else [int(c) for c in cuts]
    by_ngram = [False] * len(tokens)
    for q, (n, start) in enumerate(_matches_at_every_state(tokens, min_n, max_n)):
        if q < 1 or n < min_match:
            continue
        follow = tokens[start + n:min(start + n + k, q + 1)]  # what was committed by state q
        truth = tokens[q + 1:q + 1 + len(follow)]
        right = 0
        while right < len(truth) and follow[right] == truth[right]:
            right += 1
        a_h[q], cuts_h[q], by_ngram[q] = right, len(follow), True
    return a_h, cuts_h, by_ngram


@lru_cache(maxsize=256)
def _matches_at_every_state(tokens: tuple[int, ...], min_n: int, max_n: int) -> list[tuple[int, int]]:
    """`ngram_match` of tokens[:q + 1] for every q (remembered: the evaluator walks one sample at several settings)."""
    return [ngram_match(tokens[:q + 1], min_n, max_n) for q in range(len(tokens))]
