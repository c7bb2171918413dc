"""DFlash's accepted-draft counts a(q) for every position of a held-out sequence: one block per anchor, batched.

State q (token q is the last committed one) is a block anchored at q that sees the features of positions < q:
exactly what the proposer computes in decoding, since a parallel drafter's block does not depend on its own
earlier drafts."""

from __future__ import annotations

import torch

from engine.algos.dflash.model import DFlashDraft


@torch.inference_mode()
def acceptance_counts(draft: DFlashDraft, aux: torch.Tensor, token_ids: torch.Tensor, k: int,
                      chunk: int = 64) -> torch.Tensor:
    """aux [T, A*Ht], token_ids [T] -> a [T] int64: leading slots 1..k of the block at q equal to tokens q+1..q+k."""
    t = int(token_ids.shape[0])
    out = torch.zeros(t, dtype=torch.long)
    k = min(k, draft.block_size - 1)
    if t < 2 or k < 1:
        return out
    dtype, device = draft.fc.weight.dtype, draft.fc.weight.device
    tokens = token_ids.long().cpu()
    ids = tokens.view(1, -1).to(device)
    g = aux.to(device=device, dtype=dtype).unsqueeze(0)
    positions = torch.arange(t, device=device).view(1, -1)
    documents = torch.zeros_like(ids)
    ctx_kv = draft.context_kv(draft.context(g), positions)  # once per sequence, shared by every chunk of anchors
    for start in range(1, t - 1, chunk):  # anchors 1..T-2 (q = 0 has no context; q = T-1 nothing to draft)
        anchors = torch.arange(start, min(start + chunk, t - 1), device=device)
        x = draft.anchored_hidden(g, ids, positions, documents, anchors, ctx_kv)[:, 1: k + 1]  # [n, k, H]
        pred = draft.greedy_drafts(x, ids[0, anchors]).cpu()                                 # [n, k]
        pos = anchors.cpu()[:, None] + torch.arange(1, k + 1)[None, :]
        truth = torch.where(pos < t, tokens[pos.clamp(max=t - 1)], torch.full_like(pos, -1))
        out[anchors.cpu()] = torch.cumprod((pred == truth).long(), dim=1).sum(1)
    return out
