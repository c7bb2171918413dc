"""P-EAGLE parallel drafting: one draft forward per step proposes k tokens (the real slot and k-1 mask slots).

As EAGLE-3's proposer, the draft cache keeps only pairs built from true target features: a step feeds the newly
verified (feature, token) pairs followed by k-1 mask slots (MASK token, fc(mask_hidden)) at the next positions,
reads the last k rows, and after verification drops the mask slots' entries.
"""

from __future__ import annotations

import torch

from engine.algos.eagle3.proposer import Eagle3Proposer
from engine.algos.peagle.model import PEagleDraft
from engine.generate.proposers import Proposal
from engine.generate.sampling import SamplingParams, logits_to_probs


class PEagleProposer(Eagle3Proposer):
    """EAGLE-3's bookkeeping (start/update, cache rollback) with one parallel forward in `propose`."""

    name = "peagle"

    def __init__(self, draft: PEagleDraft, *, sample_drafts: bool = True, p_min: float | None = None):
        super().__init__(draft, sample_drafts=sample_drafts, p_min=p_min)

    @torch.inference_mode()
    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        self.proposed = True
        if k < 1:
            self.committed_length = self.cache.length
            return Proposal([])
        draft = self.draft
        device = draft.fc.weight.device
        n = len(self.pending_ids)
        ids = torch.tensor([self.pending_ids + [draft.mask_token_id] * (k - 1)], dtype=torch.long, device=device)
        positions = self.cache.length + 1 + torch.arange(n + k - 1, device=device).view(1, -1)
        hidden = draft.slot_features(self.pending_aux.to(device=device, dtype=draft.fc.weight.dtype), k - 1)
        logits = draft.block_cached(ids, hidden, positions, self.cache, k).float()  # [k, Vd]
        self.committed_length = self.cache.length - (k - 1)  # the true-feature pairs; update() crops to them
        if params.greedy or not self.sample_drafts:
            choice = logits.argmax(-1)
            n = self._confident(torch.softmax(logits, -1).max(-1).values)
            return Proposal(draft.draft_to_target(choice[:n]).tolist(), withheld=k - n)
        q_draft = logits_to_probs(logits, SamplingParams(temperature=params.temperature))  # [k, Vd]
        choice = torch.multinomial(q_draft, 1, generator=generator).flatten()
        n = self._confident(q_draft.gather(-1, choice.view(-1, 1)).flatten())
        q = torch.zeros(n, self.vocab_size)
        q[:, draft.draft_to_target(torch.arange(q_draft.shape[-1], device=device)).cpu()] = q_draft[:n].cpu()
        return Proposal(draft.draft_to_target(choice[:n]).tolist(), q, withheld=k - n)

    def _confident(self, probs: torch.Tensor) -> int:
        """probs [k] of the chosen tokens -> how many lead before the first below p_min (all of them without one)."""
        if not self.p_min:
            return int(probs.shape[0])
        low = (probs < self.p_min).nonzero()
        return int(low[0, 0]) if low.numel() else int(probs.shape[0])
