"""The toy head's network: one linear layer [.., A*H] -> [.., V] over the fused target states."""

from __future__ import annotations

import torch
from torch import nn

from .config import ToyConfig


class ToyHead(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.config = cfg
        self.head = nn.Linear(len(cfg.aux_hidden_state_layer_ids) * cfg.target_hidden_size, cfg.vocab_size)

    def forward(self, aux: torch.Tensor) -> torch.Tensor:  # [.., A*H] -> [.., V]
        return self.head(aux)
