"""The toy head drafting in the decode engine: one greedy token from the last verified position's states."""

from __future__ import annotations

import torch

from engine.generate.proposers import Proposal, Proposer


class ToyProposer(Proposer):
    name = "toy"

    def __init__(self, draft, **options):
        self.draft = draft
        self.aux_layer_ids = list(draft.config.aux_hidden_state_layer_ids)
        self.last = None

    def start(self, prompt_ids, prompt_aux, first_token):
        self.last = prompt_aux[-1]  # the state whose next token is `first_token`: it predicts the one after

    @torch.inference_mode()
    def propose(self, k, params, generator):
        if k < 1:
            return Proposal([])
        return Proposal([int(self.draft(self.last.float()).argmax())])

    def update(self, accepted, next_token, aux):
        self.last = aux[-1]
