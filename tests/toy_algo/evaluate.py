"""The toy head's greedy acceptance against data: its one draft at state q is token q+2 of the data when right."""

from __future__ import annotations

import torch


@torch.inference_mode()
def acceptance_counts(draft, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """aux [T, A*H], token_ids [T] -> [T] int64 in {0, 1}.

    With token q the last committed one, the target's states of position q-1 are known and the toy drafts token
    q+1 from aux[q-1] (as its proposer does); a[q] = 1 when that draft equals token_ids[q+1] and k >= 1."""
    t = int(token_ids.shape[0])
    counts = torch.zeros(t, dtype=torch.long)
    if k < 1 or t < 3:
        return counts
    drafts = draft(aux[: t - 2].float()).argmax(-1)                   # from aux[q-1], q = 1..t-2
    counts[1: t - 1] = (drafts == token_ids[2:t].to(drafts.device)).long().cpu()
    return counts
