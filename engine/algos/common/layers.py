"""Llama/Qwen3 building blocks of draft models, with the tensor names vLLM and speculators load.

Notation: B batch, T tokens, S keys, H hidden, nh/nkv heads, hd head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.generate.cpu_kernels import fused_linears, masked_rows_attention

# attend(layer_index, q [B,nh,T,hd], k [B,nkv,T,hd], v [B,nkv,T,hd]) -> [B,nh,T,hd]: the caller decides
# which keys a query sees (a KV cache at inference, document/step masks in training).
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LayerDims:
    """Shapes of one draft decoder layer, read from a `transformer_layer_config` dict."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool

    @classmethod
    def from_config(cls, tlc: dict[str, Any]) -> LayerDims:
        h = int(tlc["hidden_size"])
        nh = int(tlc["num_attention_heads"])
        return cls(hidden=h, heads=nh, kv_heads=int(tlc.get("num_key_value_heads") or nh),
                   head_dim=int(tlc.get("head_dim") or h // nh), intermediate=int(tlc["intermediate_size"]),
                   eps=float(tlc.get("rms_norm_eps", 1e-6)), qk_norm=tlc.get("model_type") == "qwen3",
                   attention_bias=bool(tlc.get("attention_bias")), mlp_bias=bool(tlc.get("mlp_bias")))


def hf_layer_config(tlc: dict[str, Any]):
    """The draft decoder's Hugging Face config object (for its rotary embedding)."""
    from transformers import AutoConfig

    tlc = dict(tlc)
    return AutoConfig.for_model(tlc.pop("model_type", "llama"), **tlc)


def rotary_embedding(tlc: dict[str, Any]) -> nn.Module:
    """cos/sin for positions [B,T] -> ([B,T,hd], [B,T,hd]) with the layer config's RoPE parameters."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(hf_layer_config(tlc))


def layer_windows(tlc: dict[str, Any], num_layers: int) -> list[int | None]:
    """Sliding window per layer (None = full attention), from `layer_types` and `sliding_window`."""
    types = tlc.get("layer_types") or []
    window = tlc.get("sliding_window")
    return [window if i < len(types) and types[i] == "sliding_attention" else None for i in range(num_layers)]


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) over the last dimension, computed in fp32, returned in x's dtype (an RMSNorm without a weight)."""
    dtype = x.dtype
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, as Llama/Qwen3 do."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms(x, self.eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B,nkv,T,hd] -> [B,nkv*n,T,hd] (grouped-query attention)."""
    return x if n == 1 else x.repeat_interleave(n, dim=1)


class Attention(nn.Module):
    """q/k/v/o projections (+ Qwen3 q/k norms) and RoPE; the attention itself is supplied by the caller."""

    def __init__(self, dims: LayerDims, in_dim: int | None = None):
        super().__init__()
        in_dim = in_dim or dims.hidden
        self.nh, self.nkv, self.hd = dims.heads, dims.kv_heads, dims.head_dim
        bias = dims.attention_bias
        self.q_proj = nn.Linear(in_dim, self.nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(in_dim, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(in_dim, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nh * self.hd, dims.hidden, bias=bias)
        if dims.qk_norm:
            self.q_norm = RMSNorm(self.hd, dims.eps)
            self.k_norm = RMSNorm(self.hd, dims.eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B,T,in] -> q [B,nh,T,hd], k/v [B,nkv,T,hd] with RoPE applied."""
        b, t, _ = x.shape
        if torch.is_grad_enabled():
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:  # inference: one call on the three weights joined
            q, k, v = fused_linears(self, (self.q_proj, self.k_proj, self.v_proj), x).split(
                [self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(b, t, self.nh, self.hd)
        k = k.view(b, t, self.nkv, self.hd)
        v = v.view(b, t, self.nkv, self.hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B,1,T,hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values only (extra context rows, e.g. injected target features): x [B,T,in] -> k/v [B,nkv,T,hd]."""
        b, t, _ = x.shape
        k = self.k_proj(x).view(b, t, self.nkv, self.hd)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        if self.k_norm is not None:
            k = self.k_norm(k)
        k = k.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return k * cos + rotate_half(k) * sin, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B,nh,T,hd] -> [B,T,H]."""
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)); `act` SiLU (Llama, Qwen3) unless given (Gemma's tanh GELU)."""

    def __init__(self, hidden: int, inter: int, bias: bool = False,
                 act: Callable[[torch.Tensor], torch.Tensor] = F.silu):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = fused_linears(self, (self.gate_proj, self.up_proj), x).chunk(2, dim=-1)  # inference: one call
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    """A pre-norm Llama/Qwen3 decoder layer: x + attn(norm(x)), then + mlp(norm(.)).

    Subclasses change what enters attention by overriding `attention_input` (EAGLE-3's first layer
    reads [embedding; hidden])."""

    def __init__(self, dims: LayerDims, index: int, *, attn_in_dim: int | None = None):
        super().__init__()
        self.index = index
        self.hidden = dims.hidden
        self.self_attn = Attention(dims, attn_in_dim)
        self.mlp = MLP(dims.hidden, dims.intermediate, bias=dims.mlp_bias)
        self.input_layernorm = RMSNorm(dims.hidden, dims.eps)
        self.post_attention_layernorm = RMSNorm(dims.hidden, dims.eps)

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,*] -> (residual [B,T,H], attention input [B,T,in])."""
        return x, self.input_layernorm(x)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        residual, attn_in = self.attention_input(x)
        q, k, v = self.self_attn.qkv(attn_in, cos, sin)
        x = residual + self.self_attn.out(attend(self.index, q, k, v))
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class DraftCache:
    """Per-layer K/V of the draft ([B,nkv,S,hd]); `crop` rolls back rejected positions."""

    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def crop(self, length: int) -> None:
        for i, k in enumerate(self.keys):
            if k is not None:
                self.keys[i] = k[:, :, :length]
                self.values[i] = self.values[i][:, :, :length]


def cached_attend(cache: DraftCache, windows: list[int | None], kv_groups: int, new_tokens: int,
                  device) -> Attend:
    """Causal attention of `new_tokens` queries over the cache plus themselves (appending their K/V)."""
    past = cache.length
    q_pos = past + torch.arange(new_tokens, device=device)
    k_pos = torch.arange(past + new_tokens, device=device)
    causal = k_pos[None, :] <= q_pos[:, None]  # [T,S]

    def attend(i, q, k, v):
        k_all, v_all = cache.append(i, k, v)
        mask = causal
        if windows[i]:
            mask = mask & (k_pos[None, :] > q_pos[:, None] - windows[i])
        whole = windows[i] is None or past + new_tokens <= windows[i]  # every query sees every earlier key
        if whole and q.shape[0] == 1 and not torch.is_grad_enabled():
            # causal rows over the whole cache: grouped products (SDPA's one-row kernel is slower on long caches)
            return masked_rows_attention(q[0], k_all[0], v_all[0], q.shape[-1] ** -0.5).transpose(0, 1)[None]
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask[None, None],
                                              enable_gqa=kv_groups > 1)  # no copies of the grouped keys

    return attend


def document_spans(document_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of equal document id in a packed row [1, T]."""
    if document_ids.shape[0] != 1:
        raise ValueError("training batches are packed into one row (B = 1)")
    d = document_ids[0]
    cuts = ((d[1:] != d[:-1]).nonzero().flatten() + 1).tolist()
    bounds = [0, *cuts, d.numel()]
    return list(pairwise(bounds))


def causal_mask(n: int, window: int | None, *, padding: bool, device) -> torch.Tensor:
    """[1,1,n,n] boolean: causal (within a sliding window when given); padding queries see only themselves."""
    idx = torch.arange(n, device=device)
    if padding:
        return torch.eye(n, dtype=torch.bool, device=device)[None, None]
    m = idx[None, :] <= idx[:, None]
    if window:
        m = m & (idx[None, :] > idx[:, None] - window)
    return m[None, None]


def init_draft_weights(module: nn.Module, std: float, *, skip: tuple[str, ...] = ("embed_tokens",)) -> None:
    """speculators' initialisation: matrices ~ N(0, std), biases 0, norm weights 1 (named prefixes skipped)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.startswith(skip):
                continue
            if p.dim() >= 2:
                p.normal_(0.0, std)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def module_to_dtype_except(module: nn.Module, dtype: torch.dtype, keep: tuple[str, ...] = ("embed_tokens",)) -> None:
    """Cast every child but the named ones (a shared frozen verifier embedding keeps its dtype)."""
    for name, child in module.named_children():
        if name not in keep:
            child.to(dtype=dtype)
