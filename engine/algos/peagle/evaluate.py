"""P-EAGLE's accepted-draft counts a(q) for every position of a held-out sequence, from one parallel forward.

A parallel drafter's block does not depend on its own earlier drafts, so every state "last committed token at
index q" is the element chain (anchor q-1, depths 0..k-1) of one `parallel_forward` over the whole sequence with
every anchor at every depth: what the proposer computes in decoding. The counting is EAGLE-3's (same alignment:
depth j at row r drafts token r+j+2)."""

from __future__ import annotations

import torch

from engine.algos.eagle3.evaluate import confidences_from_steps, counts_from_steps, expectation_from_steps
from engine.algos.peagle.model import PEagleDraft


@torch.inference_mode()
def depth_logits(draft: PEagleDraft, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> list[torch.Tensor]:
    """k x [T-1, Vd] (fp32, CPU): depth j's logits at row r draft token r+j+2 (state q = r+1 drafts q+j+1)."""
    t = int(token_ids.shape[0])
    dtype, device = draft.fc.weight.dtype, draft.fc.weight.device
    ids = token_ids.long().view(1, -1)[:, 1:].to(device)                    # x_1..x_{T-1}
    g = aux[:-1].to(device=device, dtype=dtype).unsqueeze(0)              # g_0..g_{T-2}
    rows = torch.arange(t - 1, device=device)
    anchors = rows.repeat(k - 1)
    depths = torch.arange(1, k, device=device).repeat_interleave(t - 1)
    logits = draft.parallel_forward(g, ids, rows.view(1, -1) + 1, torch.zeros_like(ids), anchors, depths)[0]
    return [x.float().cpu() for x in logits.split(t - 1)]


@torch.inference_mode()
def acceptance_counts(draft: PEagleDraft, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """aux [T, A*Ht], token_ids [T] -> a [T] int64 in 0..k (see `DraftAlgorithm.acceptance_counts`)."""
    t = int(token_ids.shape[0])
    if t < 3 or k < 1:
        return torch.zeros(t, dtype=torch.long)
    return counts_from_steps(draft, depth_logits(draft, aux, token_ids, k), token_ids.long().cpu())


@torch.inference_mode()
def acceptance_expectation(draft: PEagleDraft, aux: torch.Tensor, token_ids: torch.Tensor,
                           target_logits: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    """[T, k] chance that drafts 1..j+1 made at state q are all accepted at `temperature` (an expectation)."""
    t = int(token_ids.shape[0])
    if t < 3 or k < 1:
        return torch.zeros(t, k)
    return expectation_from_steps(draft, depth_logits(draft, aux, token_ids, k), target_logits, t, k, temperature)


@torch.inference_mode()
def counts_and_confidences(draft: PEagleDraft, aux: torch.Tensor, token_ids: torch.Tensor,
                           k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a [T], conf [T, k]: each depth's top probability) from one parallel forward (no depth reads another's draft)."""
    t = int(token_ids.shape[0])
    if t < 3 or k < 1:
        return torch.zeros(t, dtype=torch.long), torch.zeros(t, k)
    steps = depth_logits(draft, aux, token_ids, k)
    return counts_from_steps(draft, steps, token_ids.long().cpu()), confidences_from_steps(steps)
