"""EAGLE-3 chain drafting: step 0 over newly verified (feature, token) pairs, then k-1 steps on its own output."""

from __future__ import annotations

import torch

from engine.algos.common.layers import DraftCache
from engine.algos.eagle3.model import Eagle3Draft
from engine.generate.proposers import Proposal, Proposer
from engine.generate.sampling import SamplingParams, logits_to_probs


class Eagle3Proposer(Proposer):
    """Pairs the target feature g_t with the next token x_{t+1} at draft position t+1 (speculators' alignment).

    The draft cache keeps only pairs built from true target features; the entries of drafting steps are
    dropped after each verification, and the newly verified pairs are fed in the next step-0 pass.
    """

    # A step another proposer drafted (draft_ngram) adds its verified pairs to those waiting. With `p_min` the chain
    # stops before a token whose draft probability is below it (llama.cpp's `--spec-draft-p-min`).

    name = "eagle3"

    def __init__(self, draft: Eagle3Draft, *, sample_drafts: bool = True, p_min: float | None = None):
        if p_min is not None and not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min {p_min} is not a probability")
        self.draft = draft
        self.p_min = p_min or 0.0
        self.proposed = False  # whether propose() ran since the last update (its step-0 pass fed the waiting pairs)
        self.aux_layer_ids = list(draft.config.eagle_aux_hidden_state_layer_ids or [])
        self.sample_drafts = sample_drafts
        self.cache = DraftCache()
        self.pending_aux: torch.Tensor | None = None  # [n, A*Ht] features not yet fed to the draft
        self.pending_ids: list[int] = []              # the tokens that follow them
        self.vocab_size = draft.config.vocab_size

    def start(self, prompt_ids, prompt_aux, first_token):
        self.cache = DraftCache()
        self.proposed = False
        self.pending_aux = prompt_aux
        self.pending_ids = list(prompt_ids[1:]) + [first_token]

    @torch.inference_mode()
    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        self.proposed = True
        dtype = self.draft.fc.weight.dtype
        committed = self.cache.length
        # step 0: true features of every newly verified position, paired with the token that followed
        ids = torch.tensor([self.pending_ids], dtype=torch.long)
        positions = committed + 1 + torch.arange(ids.shape[1]).view(1, -1)
        hidden = self.draft.fuse(self.pending_aux.to(dtype).unsqueeze(0))  # [1,n,H]
        # [1,1,H], [1,1,Vd]: the head runs on the last position only; the cache gets all n
        hidden, logits = self.draft.forward_cached(ids, hidden, positions, self.cache, last_only=True)
        self.committed_length = self.cache.length
        logits = logits[0, -1]
        tokens, dists, withheld = [], [], 0
        for step in range(k):
            token, dist = self._choose(logits, params, generator)
            if self.p_min and self.confidence(logits, token, dist) < self.p_min:
                withheld = 1  # computed, not sent: the chain stops here
                break
            tokens.append(token)
            if dist is not None:
                dists.append(dist)
            if step == k - 1:
                break
            pos = torch.tensor([[self.committed_length + 1 + step]])
            hidden, logits = self.draft.forward_cached(torch.tensor([[token]]), hidden, pos, self.cache, last_only=True)
            logits = logits[0, -1]
        probs = torch.stack(dists) if dists else None
        return Proposal(tokens, probs, withheld=withheld)

    def confidence(self, logits: torch.Tensor, token: int, dist: torch.Tensor | None) -> float:
        """The draft's probability of the token it chose: from the distribution it sampled, else (greedy) the top
        probability of its logits [Vd] at temperature 1, as the evaluator reads it (`confidences_from_steps`)."""
        if dist is not None:
            return float(dist[token])
        return float(torch.softmax(logits.float(), dim=-1).max())

    def _choose(self, logits: torch.Tensor, params: SamplingParams, generator):
        """Draft token (target id) and, when sampling, the full distribution it came from [V]."""
        if params.greedy or not self.sample_drafts:
            return int(self.draft.draft_to_target(torch.argmax(logits))), None
        q_draft = logits_to_probs(logits, SamplingParams(temperature=params.temperature))  # [Vd]
        choice = int(torch.multinomial(q_draft, 1, generator=generator))
        q = torch.zeros(self.vocab_size)
        q[self.draft.draft_to_target(torch.arange(q_draft.numel()))] = q_draft
        return int(self.draft.draft_to_target(torch.tensor(choice))), q

    def update(self, accepted, next_token, aux):
        if not self.proposed:  # another proposer drafted this step: its verified pairs wait with the earlier ones
            self.pending_aux = aux if self.pending_aux is None else torch.cat([self.pending_aux, aux])
            self.pending_ids += list(accepted) + [next_token]
            return
        self.proposed = False
        self.cache.crop(self.committed_length)  # drop drafting steps; keep true-feature pairs
        self.pending_aux = aux
        self.pending_ids = list(accepted) + [next_token]
