"""EAGLE-3's accepted-draft counts a(q) for every position of a held-out sequence, from one unrolled forward.

When the committed text is the target's own greedy output, a chain draft's training-time-test unroll with the
data's tokens as inputs computes what cached decoding computes for as long as its earlier drafts were right,
which is the only case in which later drafts count. So one `ttt_forward` over the sequence gives, for every
state "last committed token at index q", the number of leading drafts that equal the data.
"""

from __future__ import annotations

import torch

from engine.algos.eagle3.model import Eagle3Draft


@torch.inference_mode()
def acceptance_counts(draft: Eagle3Draft, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """aux [T, A*Ht] target features g_0..g_{T-1}, token_ids [T] -> a [T] int64 in 0..k.

    a[q] = number of leading matches of the k drafts made when token q is the last committed one (they
    predict tokens q+1..q+k). Step-0 drafting at q reads the pair (g_{q-1}, x_q): row q-1 of the shifted
    sequence, as `collate` builds it for training; a[0] = 0 (no feature precedes the first token)."""
    t = int(token_ids.shape[0])
    out = torch.zeros(t, dtype=torch.long)
    if t < 3 or k < 1:
        return out
    dtype, device = draft.fc.weight.dtype, draft.fc.weight.device
    token_ids = token_ids.long().cpu()
    ids = token_ids.view(1, -1).to(device)
    g = aux[:-1].to(device=device, dtype=dtype).unsqueeze(0)  # [1, T-1, A*Ht]: g_0..g_{T-2}
    inputs = ids[:, 1:]                                        # x_1..x_{T-1}
    positions = torch.arange(1, t, device=device).view(1, -1)
    documents = torch.zeros_like(inputs)
    logits = draft.ttt_forward(g, inputs, positions, documents, steps=k)  # k x [1, T-1, Vd]
    alive = torch.ones(t - 1, dtype=torch.bool)               # rows whose drafts 0..j-1 were all right
    for j, step_logits in enumerate(logits):
        pred = draft.draft_to_target(step_logits[0].argmax(-1)).cpu()  # [T-1]: row r predicts x_{r+j+2}
        truth = torch.full((t - 1,), -1, dtype=torch.long)
        n = t - 2 - j                                            # rows with a data token to compare against
        if n > 0:
            truth[:n] = token_ids[j + 2: j + 2 + n]
        alive &= pred == truth
        out[1:] += alive.long()                                  # state q = row q-1 + 1
    return out
