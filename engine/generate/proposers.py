"""The proposer interface: anything that drafts up to k tokens per step for the target to verify.

Chain drafters run one draft forward per token; parallel drafters produce the whole block in one
forward; n-gram lookup runs no model. All fit `propose(k)`. Draft proposers come from their algorithm
(`engine.algos.ALGOS[...].proposer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.generate.sampling import SamplingParams


@dataclass
class Proposal:
    tokens: list[int]                 # draft tokens in the target vocabulary (may be fewer than k, or none)
    probs: torch.Tensor | None = None  # [n, V] the distributions the tokens were sampled from; None = deterministic
    withheld: int = 0                  # tokens drafted after `tokens` but not sent for verification (a confidence cut)
    confidence: list[float] | None = None  # the proposer's own survival estimate per drafted token, withheld included


class Proposer:
    """Base class. The engine calls start() after prefill, then propose()/update() once per step."""

    name = "proposer"
    aux_layer_ids: list[int] | None = None  # target layers whose hidden states the proposer reads

    def start(self, prompt_ids: list[int], prompt_aux: torch.Tensor | None, first_token: int) -> None:
        """prompt_aux [P, A*H]: target aux states at the prompt positions; first_token: the target's first token."""

    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        raise NotImplementedError

    def update(self, accepted: list[int], next_token: int, aux: torch.Tensor | None) -> None:
        """After verification: accepted draft tokens, the target's next token, and the target aux states
        [len(accepted)+1, A*H] at the positions that were verified and kept (last token + accepted)."""

