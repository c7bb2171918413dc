"""DSpark's accepted-draft counts a(q) and sampled-acceptance expectations for every position of a held-out
sequence: one backbone block per anchor (batched, as DFlash), then the Markov head left to right.

Greedy counts run the head on the draft's own choices, exactly what the proposer does; `counts_and_cuts` also
gives the static cut at each state (how many drafts the proposer verifies there), which the walk applies."""

from __future__ import annotations

import torch

from engine.algos.dspark.model import DSparkDraft


def _blocks(draft: DSparkDraft, aux: torch.Tensor, token_ids: torch.Tensor, chunk: int):
    """Yield (anchors [n] on the draft's device, decoder output [n, B, H]) for anchors 1..T-2 in chunks."""
    t = int(token_ids.shape[0])
    dtype, device = draft.fc.weight.dtype, draft.fc.weight.device
    ids = token_ids.long().view(1, -1).to(device)
    g = aux.to(device=device, dtype=dtype).unsqueeze(0)
    positions = torch.arange(t, device=device).view(1, -1)
    documents = torch.zeros_like(ids)
    ctx_kv = draft.context_kv(draft.context(g), positions)  # once per sequence, shared by every chunk of anchors
    for start in range(1, t - 1, chunk):  # q = 0 has no context; q = T-1 has nothing to draft
        anchors = torch.arange(start, min(start + chunk, t - 1), device=device)
        yield anchors, draft.anchored_hidden(g, ids, positions, documents, anchors, ctx_kv)


@torch.inference_mode()
def counts_and_cuts(draft: DSparkDraft, aux: torch.Tensor, token_ids: torch.Tensor, k: int, threshold: float,
                    chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """aux [T, A*Ht], token_ids [T] -> (a [T], cuts [T]) int64: cuts[q] = drafts the static cut at `threshold`
    keeps of the block at q (k without a confidence head or at threshold 0), a[q] = its leading greedy drafts
    equal to the data's tokens q+1.. (a <= cuts)."""
    t = int(token_ids.shape[0])
    k = min(k, draft.block_size)
    out, cuts = torch.zeros(t, dtype=torch.long), torch.full((t,), max(k, 0), dtype=torch.long)
    if t < 2 or k < 1:
        return out, cuts
    tokens = token_ids.long().cpu()
    for anchors, x in _blocks(draft, aux, token_ids, chunk):
        drafted, _, conf = draft.draft_sequentially(x, token_ids.long().to(anchors.device)[anchors], k,
                                                    lambda logits: logits.argmax(-1))
        pred = draft.draft_to_target(drafted).cpu()                                   # [n, k]
        pos = anchors.cpu()[:, None] + torch.arange(1, k + 1)[None, :]
        truth = torch.where(pos < t, tokens[pos.clamp(max=t - 1)], torch.full_like(pos, -1))
        run = torch.cumprod((pred == truth).long(), dim=1).sum(1)                     # [n]
        if conf is not None and threshold > 0:                                        # the proposer's rule
            alive = torch.cumprod(torch.sigmoid(conf.float()), 1) >= threshold        # [n, k]
            cuts[anchors.cpu()] = torch.cumprod(alive.long(), 1).sum(1).cpu()
        out[anchors.cpu()] = torch.minimum(run, cuts[anchors.cpu()])
    return out, cuts


def acceptance_counts(draft: DSparkDraft, aux: torch.Tensor, token_ids: torch.Tensor, k: int,
                      chunk: int = 64) -> torch.Tensor:
    """a [T] of the uncut block: leading greedy drafts of the block at q equal to q+1..q+k."""
    return counts_and_cuts(draft, aux, token_ids, k, 0.0, chunk)[0]


@torch.inference_mode()
def acceptance_expectation(draft: DSparkDraft, aux: torch.Tensor, token_ids: torch.Tensor,
                           target_logits: torch.Tensor, k: int, temperature: float, chunk: int = 64) -> torch.Tensor:
    """[T, k]: entry (q, j) = prod_{i<=j} sum_x min(p_i(x), q_i(x)), both at `temperature`; q_i is the corrected
    draft distribution of slot i given the data's earlier tokens (teacher-forced), p_i the target's at q + i."""
    t = int(token_ids.shape[0])
    out = torch.zeros(t, k)
    k = min(k, draft.block_size)
    if t < 3 or k < 1:
        return out
    ids = token_ids.long()
    vocab = target_logits.shape[-1]
    for anchors, x in _blocks(draft, aux, token_ids, chunk):
        device = anchors.device
        prev = (anchors[:, None] + torch.arange(draft.block_size, device=device)[None, :]).clamp(max=t - 1)
        logits, _ = draft.heads(x, ids.to(device)[prev])                               # [n, B, Vd]
        draft_ids = draft.draft_to_target(torch.arange(logits.shape[-1], device=device)).cpu()
        alive = torch.ones(anchors.numel())
        for j in range(k):
            pos = anchors.cpu() + j                                                      # target row predicting +1
            inside = pos + 1 < t
            q = torch.zeros(anchors.numel(), vocab)
            q[:, draft_ids] = torch.softmax(logits[:, j].float().cpu() / temperature, dim=-1)
            p = torch.softmax(target_logits[pos.clamp(max=t - 1)].float() / temperature, dim=-1)
            alive = alive * torch.minimum(p, q).sum(-1) * inside
            out[anchors.cpu(), j] = alive
    return out
