"""DFlash2 drafting: DFlash's block over the committed context, then the selector's left-to-right walk over each
slot's top-k candidates (greedy, or sampled from softmax(scores / T) with that distribution returned)."""

from __future__ import annotations

import torch

from engine.algos.dflash.proposer import DFlashProposer
from engine.generate.proposers import Proposal
from engine.generate.sampling import SamplingParams, logits_to_probs


class DFlash2Proposer(DFlashProposer):
    name = "dflash2"

    def sampled_proposal(self, x: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
                         ) -> Proposal:
        """x [k, H] -> drafts sampled slot by slot among the candidates, q [k, V] zero outside them."""
        probs: list[torch.Tensor] = []
        temperature = SamplingParams(temperature=params.temperature)

        def choose(scores: torch.Tensor) -> torch.Tensor:          # [1, K] -> [1]
            q = logits_to_probs(scores.float(), temperature)
            probs.append(q[0])
            return torch.multinomial(q, 1, generator=generator).flatten()

        anchor = torch.tensor([self.anchor], device=x.device)
        tokens, _, candidates = self.draft.walk(self.draft.norm(x)[None], anchor, choose)
        q = torch.zeros(x.shape[0], self.vocab_size)
        q.scatter_(1, candidates[0].cpu(), torch.stack(probs).cpu())
        return Proposal(tokens[0].tolist(), q)
