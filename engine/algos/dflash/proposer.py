"""DFlash block drafting: one draft forward per step proposes up to B-1 tokens; only the committed context is kept.

The cache holds the per-layer K/V of the target features of committed positions. A step places the block
[last committed token, MASK x (B-1)] at positions q..q+B-1, reads slots 1..k, and forgets the block; after
verification the target features of the newly committed positions join the context.
"""

from __future__ import annotations

import torch

from engine.algos.dflash.model import DFlashDraft
from engine.generate.proposers import Proposal, Proposer
from engine.generate.sampling import SamplingParams, logits_to_probs


class DFlashProposer(Proposer):
    name = "dflash"

    def __init__(self, draft: DFlashDraft, *, sample_drafts: bool = True):
        self.draft = draft
        self.aux_layer_ids = sorted(draft.config.aux_hidden_state_layer_ids or [])
        self.sample_drafts = sample_drafts
        self.vocab_size = draft.config.vocab_size
        self.ctx: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer [1,nkv,S,hd]
        self.anchor = 0
        self.anchor_pos = 0

    @torch.inference_mode()
    def _extend(self, aux: torch.Tensor) -> None:
        """Add the target features of the next committed positions [n, A*Ht] to the context K/V."""
        start = 0 if self.ctx is None else self.ctx[0][0].shape[2]
        dtype, device = self.draft.fc.weight.dtype, self.draft.fc.weight.device
        c = self.draft.context(aux.to(device=device, dtype=dtype).unsqueeze(0))  # [1,n,H]
        positions = (start + torch.arange(c.shape[1], device=device)).view(1, -1)
        new = self.draft.context_kv(c, positions)
        self.ctx = new if self.ctx is None else [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2))
                                                  for (k0, v0), (k1, v1) in zip(self.ctx, new, strict=True)]

    def start(self, prompt_ids, prompt_aux, first_token):
        self.ctx = None
        self._extend(prompt_aux)                 # g_0..g_{P-1}
        self.anchor, self.anchor_pos = int(first_token), len(prompt_ids)

    def block_hidden(self) -> torch.Tensor:
        """The decoder output [1, B, H] of the block [anchor, MASK x (B-1)] over the committed context."""
        b = self.draft.block_size
        device = self.draft.fc.weight.device
        ids = torch.full((1, b), self.draft.mask_token_id, dtype=torch.long, device=device)
        ids[0, 0] = self.anchor
        positions = (self.anchor_pos + torch.arange(b, device=device)).view(1, -1)
        s = self.ctx[0][0].shape[2]
        ctx_mask = torch.ones(b, s, dtype=torch.bool, device=device)
        window = next((w for w in self.draft.windows if w), None)
        if window:
            ctx_mask[:, : max(0, s - window)] = False
        return self.draft.block_forward(ids, positions, self.ctx, ctx_mask)

    @torch.inference_mode()
    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        k = min(k, self.draft.block_size - 1)
        if k < 1:
            return Proposal([])
        x = self.block_hidden()[0, 1: k + 1]                 # [k, H]: slot i drafts the token at anchor + i
        if params.greedy or not self.sample_drafts:
            return Proposal(self.greedy_tokens(x))
        return self.sampled_proposal(x, params, generator)

    def greedy_tokens(self, x: torch.Tensor) -> list[int]:
        """Decoder output of the drafting slots [k, H] -> the k greedy drafts (target ids)."""
        anchor = torch.tensor([self.anchor], device=x.device)
        return self.draft.greedy_drafts(x[None], anchor)[0].tolist()

    def sampled_proposal(self, x: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
                         ) -> Proposal:
        """Decoder output of the drafting slots [k, H] -> drafts sampled at the temperature and their q [k, V]."""
        k, device = x.shape[0], x.device
        logits = self.draft.logits(x).float()                # [k, Vd]
        q_draft = logits_to_probs(logits, SamplingParams(temperature=params.temperature))  # [k, Vd]
        choice = torch.multinomial(q_draft, 1, generator=generator).flatten()
        q = torch.zeros(k, self.vocab_size)
        q[:, self.draft.draft_to_target(torch.arange(q_draft.shape[-1], device=device)).cpu()] = q_draft.cpu()
        return Proposal(self.draft.draft_to_target(choice).tolist(), q)

    def update(self, accepted, next_token, aux):
        self._extend(aux)                        # features of [anchor, accepted...]: positions anchor_pos..
        self.anchor_pos += len(accepted) + 1
        self.anchor = int(next_token)
