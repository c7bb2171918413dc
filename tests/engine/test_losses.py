"""The fused forward KL every objective uses equals autograd's log_softmax + kl_div, in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.algos.common.losses import forward_kl


def _reference(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    return F.kl_div(F.log_softmax(logits.float(), -1), probs.float(), reduction="none").sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_forward_kl_equals_autograds_in_value_and_gradient(dtype):
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 5, 97)).to(dtype).requires_grad_()
    probs = torch.softmax(2 * torch.randn(2, 5, 97), -1)
    probs[0, 0] = 0.0
    probs[0, 0, 7] = 1.0  # a one-hot row: 0 log 0 counts as 0
    weights = torch.rand(2, 5)
    want = _reference(logits, probs)
    (want_grad,) = torch.autograd.grad((want * weights).sum(), logits)
    got = forward_kl(logits, probs)
    (got_grad,) = torch.autograd.grad((got * weights).sum(), logits)
    assert got.dtype == torch.float32 and got_grad.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad.float(), want_grad.float(), rtol=1e-4, atol=1e-6 if dtype == torch.float32
                               else 1e-2)
    assert (got > -1e-5).all()  # a KL: equal distributions give 0, never less
    assert forward_kl(torch.log(probs[1]), probs[1]).abs().max() < 1e-5
