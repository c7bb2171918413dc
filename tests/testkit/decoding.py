"""The decode engine's shared checks: prompts, an oracle proposer, and the exact second-token distribution."""

from __future__ import annotations

import torch

from engine.generate.proposers import Proposal, Proposer
from engine.generate.sampling import logits_to_probs

PROMPTS = ["hello there, how are you", "1 2 3 4 5 6 7 8 9 10, the numbers go on", "def add(a, b):",
           "The quick brown fox jumps over the lazy dog. The quick brown fox", "user assistant system"]


class OracleProposer(Proposer):
    """Proposes the target's own greedy continuation (always accepted) — or garbage when `wrong`; `cycle` makes
    draft i wrong from position (step mod k+1) on, so every step accepts a different number (0..k) of them."""

    name = "oracle"

    def __init__(self, target, wrong=False, propose_eos_at=None, cycle=False):
        self.target, self.wrong, self.eos_at, self.cycle = target, wrong, propose_eos_at, cycle
        self.tokens, self.steps = [], 0

    def start(self, prompt, aux, first):
        self.tokens, self.steps = list(prompt) + [first], 0

    def propose(self, k, params, generator):
        seq, out = list(self.tokens), []
        self.steps += 1
        with torch.inference_mode():
            for i in range(k):
                nxt = int(self.target.model(torch.tensor([seq])).logits[0, -1].argmax())
                if self.wrong or (self.cycle and i >= self.steps % (k + 1)):
                    nxt = (nxt + 1) % self.target.vocab_size
                if self.eos_at is not None and len(out) == self.eos_at:
                    nxt = 2
                out.append(nxt)
                seq.append(nxt)
        return Proposal(out)

    def update(self, accepted, next_token, aux):
        self.tokens += list(accepted) + [next_token]


def chi_square_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0) -> float:
    n = observed.sum()
    expected = expected_probs * n
    big = expected >= min_expected
    obs = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2) / exp)[keep].sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def second_token_distribution(target, prompt, params) -> torch.Tensor:
    """Exact P(second generated token) = sum_t0 p(t0) p(t1 | t0) under the sampling params."""
    with torch.inference_mode():
        logits = target.model(torch.tensor([prompt])).logits[0, -1]
        p0 = logits_to_probs(logits, params)
        seqs = torch.tensor([prompt + [t] for t in range(target.vocab_size)])
        p1 = logits_to_probs(target.model(seqs).logits[:, -1], params)  # [V, V]
    return p0 @ p1
