"""Fast, row-invariant decode kernels for a bf16 target on CPU: a k-token verification costs about one step."""

# Two routings, both exact where the kernel choice measured them so:
# - linears over 1..MAX_ROWS rows run in one of four forms (LINEAR_FORMS): `weight @ x^T` with one row
#   padded to two (on the Intel Xeon with AMX the blocked bf16 GEMM, while `F.linear` runs one bf16 row as
#   a slow GEMV); the same with one row left to `F.linear`'s GEMV; `F.linear` with one row padded to two
#   (on the AMD EPYC Zen 4 its bf16 GEMM is row-invariant and faster than `weight @ x^T`, while its GEMV
#   rounds differently from it for some shapes); or `F.linear` with one row padded only for those shapes
#   (checked per shape, `gemv_matches_gemm`: the GEMV is the cheaper one-row kernel). Which is exact and
#   fastest is measured per CPU, never assumed; tests assert only bf16 closeness to `F.linear`.
# - attention over 1..MAX_ROWS new query rows sees, for each row, exactly the keys that row may see: one
#   row at a time through SDPA, or all rows at once as eager products with each row's unseen keys masked
#   (ATTENTION_FORMS). The fused SDPA kernel over several query rows rounds differently from one row in
#   bf16, so a verification forward would not reproduce the decode steps it replaces and greedy
#   speculative decoding would drift from the baseline at near-ties; these forms reproduce them bit for
#   bit where measured so. Only inside `decode_scope()` (TargetRunner's forwards): training, extraction
#   and transformers' own `generate` on the same model keep plain SDPA.
# tests/engine/test_cpu_kernels.py checks both; engine.generate.kernel_choice measures on each CPU whether this
# path is exact and the fastest; BENCHMARKS.md has the timings.

from __future__ import annotations

import threading
import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS = 32  # above this F.linear's GEMM is as fast; the routing is for decode and verification shapes
_MARK = "_workbench_few_row_routed"


LINEAR_FORMS = ("gemm", "gemm-gemv1", "linear-pad2", "linear-checked", "packed-pad2",  # module docstring
                "packed")  # a draft's: oneDNN's packed weights, one row as one row (no exactness needed)
PACKED_FORMS = ("packed-pad2", "packed")  # the forms that run on `packed_weight`
LINEAR_FORM = "_workbench_linear_form"
_PACKED = "_workbench_packed_weight"


def packed_linear_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """oneDNN's prepacked linear runs here in `dtype` (bf16: natively only): the packed forms may be measured."""
    try:
        if dtype == torch.bfloat16:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return dtype == torch.float32 and torch.backends.mkldnn.is_available()
    except (AttributeError, RuntimeError):
        return False


def packed_weight(owner: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's blocked layout, packed once and kept on `owner` (repacked if the weight
    changes): F.linear on a bf16 weight took 1.4-1.8x as long for 1-2 rows (BENCHMARKS.md). A second copy of the
    weight's bytes."""
    key = (weight.data_ptr(), weight._version, tuple(weight.shape))
    cached = owner.__dict__.get(_PACKED)
    if cached is None or cached[0] != key:
        cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 2))
        owner.__dict__[_PACKED] = cached
    return cached[1]
_GEMV_MATCHES_GEMM: dict[tuple, bool] = {}  # (out, in, dtype, threads) -> one-row GEMV equals every GEMM row here


def gemv_matches_gemm(weight: torch.Tensor) -> bool:
    """Whether, on this CPU and thread count, `F.linear` of one row (its GEMV) gives bit for bit the rows of
    `F.linear` over 2..MAX_ROWS rows (its GEMM) for this weight's shape. Which kernel runs and how it orders its sums
    depend on the shapes, not the values, so one random input per row count decides it; cached per shape."""
    key = (*weight.shape, weight.dtype, torch.get_num_threads())
    if key not in _GEMV_MATCHES_GEMM:
        x = torch.randn(MAX_ROWS, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        with torch.no_grad():
            one = torch.cat([F.linear(x[i:i + 1], weight) for i in range(MAX_ROWS)])  # [R, out], GEMV each
            _GEMV_MATCHES_GEMM[key] = all(torch.equal(F.linear(x[:rows], weight), one[:rows])
                                          for rows in range(2, MAX_ROWS + 1))
    return _GEMV_MATCHES_GEMM[key]


def few_row_linear(weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None, *,
                   form: str = "gemm", packed: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] -> [..., out] in one of LINEAR_FORMS: `weight @ x^T` (one row padded to two, then cut; with
    "gemm-gemv1" one row is left to `F.linear`), or "linear-pad2": `F.linear` with one row padded to two;
    "linear-checked": `F.linear`, one row padded to two only for the shapes whose GEMV rounds unlike the GEMM;
    "packed-pad2": oneDNN's linear on the `packed` weight (`packed_weight`; without it as "linear-pad2")."""
    rows = x.numel() // x.shape[-1]
    if rows == 1 and (form == "gemm-gemv1" or form == "linear-checked" and gemv_matches_gemm(weight)):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])  # [R, in]
    if form in ("linear-pad2", "linear-checked", *PACKED_FORMS):
        y = pad2_linear(flat, weight, bias, packed=packed if form in PACKED_FORMS else None, pad=form != "packed")
    else:
        flat = flat.expand(2, -1) if rows == 1 else flat
        y = (weight @ flat.t()).t()[:rows].contiguous()  # [R, out]
        if bias is not None:
            y = y + bias
    return y.view(*x.shape[:-1], weight.shape[0])


def pad2_linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None, *,
                packed: torch.Tensor | None = None, pad: bool = True) -> torch.Tensor:
    """x [R, in] -> [R, out]: oneDNN's linear on the `packed` weight when given, else `F.linear`; with `pad`, one
    row is padded to two and cut (the GEMM rounds a row as it does in a batch, which the GEMV does not)."""
    rows = x.shape[0]
    if pad and rows == 1:
        x = x.expand(2, -1)
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")[:rows]
    return F.linear(x, weight, bias)[:rows]


def _routed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype in ROUTED_DTYPES and x.numel() // max(1, x.shape[-1]) <= MAX_ROWS and not torch.is_grad_enabled():
        form = getattr(self, LINEAR_FORM, "gemm")
        packed = packed_weight(self, self.weight) if form in PACKED_FORMS else None
        return few_row_linear(self.weight, x, self.bias, form=form, packed=packed)
    return F.linear(x, self.weight, self.bias)


_FUSED = "_workbench_fused_linears"


def fused_linears(owner: nn.Module, linears: tuple[nn.Linear, ...], x: torch.Tensor) -> torch.Tensor:
    """x [..., in] -> the outputs of `linears` (same input, same bias-ness) concatenated [..., sum(out)], as one
    linear on their weights joined once and kept on `owner` (joined again when a weight changes), in the form the
    first linear takes (routed, packed). For inference: fewer, larger calls; rounding may differ from the separate
    linears, so only drafts use it (the target's verification decides what is emitted)."""
    key = tuple((m.weight.data_ptr(), m.weight._version) for m in linears)
    cached = owner.__dict__.get(_FUSED)
    if cached is None or cached[0] != key:
        with torch.inference_mode(False), torch.no_grad():  # a normal tensor (packed_weight reads its version)
            weight = torch.cat([m.weight.detach() for m in linears])  # [sum(out), in]
            bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears])
        cached = owner.__dict__[_FUSED] = (key, weight, bias)
    _, weight, bias = cached
    lead = linears[0]
    if not (getattr(lead, _MARK, False) and x.dtype in ROUTED_DTYPES and x.numel() // x.shape[-1] <= MAX_ROWS):
        return F.linear(x, weight, bias)
    form = getattr(lead, LINEAR_FORM, "gemm")
    packed = packed_weight(owner, weight) if form in PACKED_FORMS else None
    return few_row_linear(weight, x, bias, form=form, packed=packed)


def routed_linears(model: nn.Module) -> bool:
    """Whether any nn.Linear of `model` takes the routed forward (else `linear_form` is only a default)."""
    return any(getattr(m, _MARK, False) for m in model.modules() if isinstance(m, nn.Linear))


def linear_form(model: nn.Module) -> str:
    """The form `model`'s routed linears (and the runner's head) take."""
    return getattr(model, LINEAR_FORM, "gemm")


def set_linear_form(model: nn.Module, form: str) -> None:
    """Routed linears of `model` (and the runner's head) run in `form` (one of LINEAR_FORMS)."""
    if form not in LINEAR_FORMS:
        raise ValueError(f"unknown linear form {form!r}; one of {LINEAR_FORMS}")
    setattr(model, LINEAR_FORM, form)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            setattr(module, LINEAR_FORM, form)


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


ATTENTION_FORMS = ("sdpa-rows", "eager-masked")  # see decode_rows_attention; "sdpa-rows" is the default
ATTENTION_FORM = "_workbench_attention_form"


def decode_rows_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """query [1, Hq, q, d] (the last q of kv positions), key/value [1, Hkv, kv, d] -> ([1, q, Hq, d], None)."""
    # Row i attends to keys [0, kv - q + i]. "sdpa-rows": one SDPA call per row, exactly the call a
    # one-token step makes. "eager-masked" (the model's ATTENTION_FORM): all rows at once as eager products,
    # q k^T, an fp32 softmax with each row's unseen keys masked, and p v, the query heads grouped by their
    # shared key head (no SDPA setup or key copies): bit for bit the one-token steps only where this CPU's
    # products ignore the row count and the masked zeros, which the kernel choice measures, never assumes.
    # Other shapes fall through to SDPA unchanged.
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _rowwise_ok(module, query, attention_mask, dropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kwargs.pop("is_causal", None)
    rows, past = query.shape[2], key.shape[2] - query.shape[2]
    form = getattr(module, ATTENTION_FORM, "sdpa-rows")
    if form == "eager-masked" and _eager_ok(query, key, kwargs):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return masked_rows_attention(query[0], key[0], value[0], scale).unsqueeze(0), None
    outs = [sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :past + i + 1],
                                   value[:, :, :past + i + 1], None, scaling=scaling, is_causal=False,
                                   **kwargs)[0] for i in range(rows)]  # each [1, 1, Hq, d]
    return torch.cat(outs, dim=1), None


def _eager_ok(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """The eager row form computes plain softmax attention: no logit softcap, no attention sinks."""
    return (query.shape[1] % key.shape[1] == 0 and kwargs.get("softcap") is None and kwargs.get("s_aux") is None
            and kwargs.get("sinks") is None)


def masked_rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, R, d] (the last R of n positions), k/v [Hkv, n, d] -> [R, Hq, d]: row r sees keys [0, n - R + r]."""
    hq, rows, d = q.shape
    hkv, n = k.shape[0], k.shape[1]
    grouped = q.reshape(hkv, hq // hkv * rows, d)  # [Hkv, g*R, d], row-minor
    scores = torch.matmul(grouped, k.transpose(-1, -2)).float() * scale  # [Hkv, g*R, n]
    if rows > 1:
        seen = torch.arange(n) <= (n - rows + torch.arange(rows)).unsqueeze(1)  # [R, n]
        scores = scores.view(hkv, -1, rows, n).masked_fill(~seen, float("-inf")).view(hkv, -1, n)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v)  # [Hkv, g*R, d]
    return out.view(hq, rows, d).transpose(0, 1)  # [R, Hq, d]


def set_attention_form(model: nn.Module, form: str) -> None:
    """Routed attention of `model` runs in `form` (one of ATTENTION_FORMS)."""
    if form not in ATTENTION_FORMS:
        raise ValueError(f"unknown attention form {form!r}; one of {ATTENTION_FORMS}")
    setattr(model, ATTENTION_FORM, form)
    for module in model.modules():
        setattr(module, ATTENTION_FORM, form)


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


def pack_draft_linears(model: nn.Module) -> bool:
    """A CPU draft's linears on oneDNN's weights packed once ("packed"): for one or two rows `F.linear` takes
    1.4-1.8x as long on a bf16 weight, and an fp32 draft beside an fp32 target went from 0.911x to 0.983x on the
    AMD EPYC Zen 4 (BENCHMARKS.md). A draft needs no row-exactness (the target's verification alone decides what
    is emitted), so one row stays one row.
    False where oneDNN's packed linear does not run in the draft's dtype (bf16 without native support)."""
    p = next(model.parameters(), None)
    if p is None or p.device.type != "cpu" or not packed_linear_available(p.dtype):
        return False
    setattr(model, FORCED, True)  # fp32 drafts are routed too
    route_few_row_linears(model)
    set_linear_form(model, "packed")
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
