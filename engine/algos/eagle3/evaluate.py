"""EAGLE-3's accepted-draft counts a(q) for every position of a held-out sequence, from one unrolled forward."""

# When the committed text is the target's own greedy output, a chain draft's training-time-test unroll with the
# data's tokens as inputs computes what cached decoding computes for as long as its earlier drafts were right,
# which is the only case in which later drafts count. So one `ttt_forward` over the sequence gives, for every
# state "last committed token at index q", the number of leading drafts that equal the data.

from __future__ import annotations

import torch

from engine.algos.eagle3.model import Eagle3Draft


@torch.inference_mode()
def step_logits(draft: Eagle3Draft, aux: torch.Tensor, token_ids: torch.Tensor, k: int,
                own_tokens: bool = False) -> list[torch.Tensor]:
    """k x [T-1, Vd] (fp32, CPU): step j's logits at row r draft token r+j+2 (state q = r+1 drafts q+j+1); with
    `own_tokens` each row's chain feeds its own drafts, as decoding does (the same logits while they are right)."""
    t = int(token_ids.shape[0])
    dtype, device = draft.fc.weight.dtype, draft.fc.weight.device
    ids = token_ids.long().view(1, -1).to(device)
    g = aux[:-1].to(device=device, dtype=dtype).unsqueeze(0)  # [1, T-1, A*Ht]: g_0..g_{T-2}
    positions = torch.arange(1, t, device=device).view(1, -1)
    logits = draft.ttt_forward(g, ids[:, 1:], positions, torch.zeros_like(ids[:, 1:]), steps=k,
                               own_tokens=own_tokens)
    return [x[0].float().cpu() for x in logits]


@torch.inference_mode()
def acceptance_expectation(draft: Eagle3Draft, aux: torch.Tensor, token_ids: torch.Tensor,
                           target_logits: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    """[T, k]: entry (q, j) = prod_{i<=j} sum_x min(p_i(x), q_i(x)), the chance that drafts 1..j+1 made at state q
    are all accepted when both sample at `temperature` (teacher-forced distributions; an expectation).

    target_logits [T, V]: the target's logits at every position (position q+j predicts token q+j+1)."""
    t = int(token_ids.shape[0])
    if t < 3 or k < 1:
        return torch.zeros(t, k)
    return expectation_from_steps(draft, step_logits(draft, aux, token_ids, k), target_logits, t, k, temperature)


def expectation_from_steps(draft, steps: list[torch.Tensor], target_logits: torch.Tensor, t: int, k: int,
                           temperature: float) -> torch.Tensor:
    """`acceptance_expectation` from k x [T-1, Vd] draft logits aligned as `step_logits` returns them (any
    drafter whose step j at row r drafts token r+j+2: EAGLE-3's unroll, P-EAGLE's parallel depths)."""
    out = torch.zeros(t, k)
    vocab = target_logits.shape[-1]
    draft_ids = draft.draft_to_target(torch.arange(steps[0].shape[-1], device=draft.fc.weight.device)).cpu()
    alive = torch.ones(t - 1)
    for j, logits in enumerate(steps):
        rows = t - 2 - j  # row r (state r+1) drafts token r+j+2, which the target's position r+j+1 predicts
        if rows <= 0:
            break
        q = torch.zeros(rows, vocab)
        q[:, draft_ids] = torch.softmax(logits[:rows] / temperature, dim=-1)
        p = torch.softmax(target_logits[j + 1: j + 1 + rows].float() / temperature, dim=-1)
        beta = torch.minimum(p, q).sum(-1)  # [rows]
        alive[:rows] *= beta
        alive[rows:] = 0.0
        out[1:, j] = alive
    return out


@torch.inference_mode()
def acceptance_counts(draft: Eagle3Draft, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """aux [T, A*Ht] target features g_0..g_{T-1}, token_ids [T] -> a [T] int64 in 0..k.

    a[q] = number of leading matches of the k drafts made when token q is the last committed one (they
    predict tokens q+1..q+k). Step-0 drafting at q reads the pair (g_{q-1}, x_q): row q-1 of the shifted
    sequence, as `collate` builds it for training; a[0] = 0 (no feature precedes the first token)."""
    t = int(token_ids.shape[0])
    if t < 3 or k < 1:
        return torch.zeros(t, dtype=torch.long)
    token_ids = token_ids.long().cpu()
    return counts_from_steps(draft, step_logits(draft, aux, token_ids, k), token_ids)


def counts_from_steps(draft, logits: list[torch.Tensor], token_ids: torch.Tensor) -> torch.Tensor:
    """`acceptance_counts` from k x [T-1, Vd] draft logits aligned as `step_logits` returns them (step j at row r
    drafts token r+j+2), for any drafter with `draft_to_target`; token_ids [T] int64 on the CPU."""
    t = int(token_ids.shape[0])
    out = torch.zeros(t, dtype=torch.long)
    alive = torch.ones(t - 1, dtype=torch.bool)               # rows whose drafts 0..j-1 were all right
    for j, step in enumerate(logits):
        pred = draft.draft_to_target(step.argmax(-1).to(draft.fc.weight.device)).cpu()  # row r: x_{r+j+2}
        truth = torch.full((t - 1,), -1, dtype=torch.long)
        n = t - 2 - j                                            # rows with a data token to compare against
        if n > 0:
            truth[:n] = token_ids[j + 2: j + 2 + n]
        alive &= pred == truth
        out[1:] += alive.long()                                  # state q = row q-1 + 1
    return out


@torch.inference_mode()
def counts_and_confidences(draft: Eagle3Draft, aux: torch.Tensor, token_ids: torch.Tensor,
                           k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a [T] as `acceptance_counts`, conf [T, k] as `confidences_from_steps`) from one unroll in which every chain
    feeds its own drafts: the confidences decoding's chain computes, past a wrong draft too."""
    t = int(token_ids.shape[0])
    if t < 3 or k < 1:
        return torch.zeros(t, dtype=torch.long), torch.zeros(t, k)
    token_ids = token_ids.long().cpu()
    steps = step_logits(draft, aux, token_ids, k, own_tokens=True)
    return counts_from_steps(draft, steps, token_ids), confidences_from_steps(steps)


def confidences_from_steps(steps: list[torch.Tensor]) -> torch.Tensor:
    """k x [T-1, Vd] draft logits (step j at row r drafts token r+j+2) -> conf [T, k]: entry (q, j) is the draft's
    top probability (temperature 1) at step j of the chain made at state q (row q-1), what a p_min cut reads."""
    out = torch.zeros(steps[0].shape[0] + 1, len(steps))
    for j, step in enumerate(steps):
        out[1:, j] = torch.softmax(step.float(), dim=-1).max(dim=-1).values
    return out
