"""Losses every draft type's objective shares: forward KL to the target's distribution in one fused pass."""

from __future__ import annotations

import torch


class _ForwardKL(torch.autograd.Function):
    """KL(p || softmax(z)) over the last dim. Forward: sum p log p - sum p z + logsumexp(z) (rows of p sum to 1);
    backward: (softmax(z) - p) * grad, one pass over [.., V] instead of autograd's log_softmax + kl_div chain."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        z = logits.float()                                                      # [.., V]
        lse = torch.logsumexp(z, -1, keepdim=True)                              # [.., 1]
        kl = torch.special.xlogy(probs, probs).sum(-1) - (probs * z).sum(-1) + lse.squeeze(-1)  # [..]
        ctx.save_for_backward(z, lse, probs)
        ctx.dtype = logits.dtype
        return kl

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        z, lse, probs = ctx.saved_tensors
        q = (z - lse).exp_()                                                    # softmax(z) [.., V]
        return q.sub_(probs).mul_(grad.unsqueeze(-1)).to(ctx.dtype), None


def forward_kl(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """KL(p_target || q_draft) per position: logits [.., V], target probabilities [.., V] (no grad) -> [..] (fp32)."""
    return _ForwardKL.apply(logits, target_probs.float())
