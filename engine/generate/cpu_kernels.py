"""Fast, row-invariant decode kernels for a bf16 target on CPU: a k-token verification costs about one step.

Two routings, both exact:
- linears over 1..MAX_ROWS rows run as `weight @ x^T` (one row padded to two). On CPUs with AMX /
  AVX-512 BF16 that takes the blocked bf16 GEMM path, while `F.linear` runs one bf16 row as a slow
  GEMV. Both accumulate in fp32 and round once (the same bits on the Intel Xeon with AMX where this was
  measured; tests assert only bf16 closeness to `F.linear`).
- attention over 1..MAX_ROWS new query rows runs one row at a time, each over exactly the keys it may
  see. The fused kernel over several query rows rounds differently from one row in bf16, so a
  verification forward would not reproduce the decode steps it replaces and greedy speculative
  decoding would drift from the baseline at near-ties; row by row it reproduces them bit for bit.
  Only inside `decode_scope()` (TargetRunner's forwards): training, extraction and transformers' own
  `generate` on the same model keep plain SDPA.
tests/engine/test_cpu_kernels.py checks both; engine.generate.kernel_choice measures on each CPU whether this
path is exact and the fastest; BENCHMARKS.md has the timings.
"""

from __future__ import annotations

import threading
import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS = 32  # above this F.linear's GEMM is as fast; the routing is for decode and verification shapes
_MARK = "_workbench_few_row_routed"


def few_row_linear(weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None, *,
                   one_row_gemv: bool = False) -> torch.Tensor:
    """x [..., in] -> [..., out] as `weight @ x^T`; one row is padded to two (the GEMM path), then cut, or with
    `one_row_gemv` left to `F.linear` (exact only on a CPU whose GEMV rounds like its GEMM: measured, never assumed)."""
    rows = x.numel() // x.shape[-1]
    if rows == 1 and one_row_gemv:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])  # [R, in]
    if rows == 1:
        flat = flat.expand(2, -1)
    y = (weight @ flat.t()).t()[:rows].contiguous()  # [R, out]
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])


def _routed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype in ROUTED_DTYPES and x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and not torch.is_grad_enabled():
        return few_row_linear(self.weight, x, self.bias, one_row_gemv=getattr(self, ONE_ROW_GEMV, False))
    return F.linear(x, self.weight, self.bias)


ONE_ROW_GEMV = "_workbench_one_row_gemv"


def one_row_as_gemv(model: nn.Module) -> None:
    """Routed linears (and the runner's head) of `model` leave one row to `F.linear`'s GEMV, the rest as above."""
    setattr(model, ONE_ROW_GEMV, True)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            setattr(module, ONE_ROW_GEMV, True)


ATTENTION = "workbench_decode_rows"
_scope = threading.local()


@contextmanager
def decode_scope():
    """Row-by-row attention for the forwards of this thread inside the block (a decode or verification step)."""
    before = getattr(_scope, "on", False)
    _scope.on = True
    try:
        yield
    finally:
        _scope.on = before


def _rowwise_ok(module: nn.Module, query: torch.Tensor, attention_mask, dropout: float) -> bool:
    """Inside decode_scope: a single unpadded causal sequence, a few new rows, bf16, inference."""
    return (getattr(_scope, "on", False) and query.shape[0] == 1 and query.shape[2] <= MAX_ROWS
            and query.dtype in ROUTED_DTYPES and not torch.is_grad_enabled() and not dropout
            and getattr(module, "is_causal", True) and getattr(module, "sliding_window", None) is None
            and (attention_mask is None or attention_mask.shape[0] == 1))


def decode_rows_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """query [1, Hq, q, d] (the last q of kv positions), key/value [1, Hkv, kv, d] -> ([1, q, Hq, d], None).

    Row i attends to keys [0, kv - q + i] through the same SDPA call a one-token step makes; other
    shapes fall through to SDPA unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _rowwise_ok(module, query, attention_mask, dropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs.pop("is_causal", None)
    rows, past = query.shape[2], key.shape[2] - query.shape[2]
    outs = [sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :past + i + 1],
                                   value[:, :, :past + i + 1], None, scaling=scaling, is_causal=False,
                                   **kwargs)[0] for i in range(rows)]  # each [1, 1, Hq, d]
    return torch.cat(outs, dim=1), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, decode_rows_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


FORCED = "_workbench_route_forced"
ROUTED_DTYPES = (torch.bfloat16, torch.float32)


def wanted(model: nn.Module) -> bool:
    """Routing is for bf16 weights on CPU, and for fp32 ones the kernel choice routes (`force_routing`)."""
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "cpu" and (p.dtype == torch.bfloat16 or getattr(model, FORCED, False))


def force_routing(model: nn.Module) -> None:
    """Route an fp32 CPU model too (its multi-row GEMMs and fused attention may not be row-invariant either)."""
    setattr(model, FORCED, True)
    route_decode_kernels(model)


def route_decode_kernels(model: nn.Module) -> bool:
    """Route a bf16 CPU target's few-row linears and attention as above (idempotent); False if not routed.

    Models whose attention is not SDPA (eager, sliding windows, custom code) keep their attention.
    """
    if not wanted(model):
        return False
    route_few_row_linears(model)
    if getattr(model.config, "_attn_implementation", None) in ("sdpa", ATTENTION):
        _register_attention()
        model.set_attn_implementation(ATTENTION)
    return True


def route_few_row_linears(model: nn.Module) -> int:
    """Install the routed forward on every nn.Linear of a bf16 CPU model (idempotent); returns how many."""
    if not wanted(model):
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and not getattr(module, _MARK, False):
            module.forward = types.MethodType(_routed_forward, module)
            setattr(module, _MARK, True)
            count += 1
    return count
