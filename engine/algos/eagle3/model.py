"""The EAGLE-3 draft model: fused aux features + token embedding -> decoder layer(s) -> draft-vocab logits.

Tensor names match speculators 0.9.0 and vLLM 0.33 (`fc`, `layers.{i}.*`, `layers.0.hidden_norm`,
`norm`, `lm_head`, `input_norm`, `fc_norm.{i}`, `d2t`, `t2d`). The same weights compute the same
logits as speculators' `Eagle3DraftModel` (tested against it).

Notation: B batch, T tokens, H draft hidden, Ht target hidden, A aux layers, Vd draft vocab,
V target vocab, nh/nkv heads, hd head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.format.config import Eagle3Config

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _hf_layer_config(cfg: Eagle3Config):
    from transformers import AutoConfig

    tlc = dict(cfg.transformer_layer_config)
    return AutoConfig.for_model(tlc.pop("model_type", "llama"), **tlc)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, as Llama/Qwen3 do."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """q/k/v/o projections (+ Qwen3 q/k norms) and RoPE; the attention itself is supplied by the caller."""

    def __init__(self, hidden: int, in_dim: int, nh: int, nkv: int, hd: int, eps: float, *, qk_norm: bool, bias: bool):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(in_dim, nh * hd, bias=bias)
        self.k_proj = nn.Linear(in_dim, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(in_dim, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, hidden, bias=bias)
        if qk_norm:
            self.q_norm = RMSNorm(hd, eps)
            self.k_norm = RMSNorm(hd, eps)
        else:
            self.q_norm = self.k_norm = None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B,T,in] -> q [B,nh,T,hd], k/v [B,nkv,T,hd] with RoPE applied."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B,1,T,hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B,nh,T,hd] -> [B,T,H]."""
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A Llama/Qwen3 decoder layer; the first EAGLE-3 layer takes [embedding; hidden] (2H) instead of H."""

    def __init__(self, cfg: Eagle3Config, index: int):
        super().__init__()
        tlc = cfg.transformer_layer_config
        h = int(tlc["hidden_size"])
        nh = int(tlc["num_attention_heads"])
        nkv = int(tlc.get("num_key_value_heads") or nh)
        hd = int(tlc.get("head_dim") or h // nh)
        eps = float(tlc.get("rms_norm_eps", 1e-6))
        self.index = index
        self.first = index == 0
        self.norm_before_residual = cfg.norm_before_residual
        self.hidden = h
        self.self_attn = Attention(h, 2 * h if self.first else h, nh, nkv, hd, eps,
                                   qk_norm=tlc.get("model_type") == "qwen3", bias=bool(tlc.get("attention_bias")))
        self.mlp = MLP(h, int(tlc["intermediate_size"]), bias=bool(tlc.get("mlp_bias")))
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        if self.first:
            self.hidden_norm = RMSNorm(h, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        if self.first:
            # x = [embedding; hidden] [B,T,2H]: the residual stream is the hidden half.
            embeds, hidden = x.split(self.hidden, dim=-1)
            residual = hidden
            hidden = self.hidden_norm(hidden)
            if self.norm_before_residual:
                residual = hidden
            attn_in = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        else:
            residual = x
            attn_in = self.input_layernorm(x)
        q, k, v = self.self_attn.qkv(attn_in, cos, sin)
        x = residual + self.self_attn.out(attend(self.index, q, k, v))
        return x + self.mlp(self.post_attention_layernorm(x))


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B,nkv,T,hd] -> [B,nkv*n,T,hd] (grouped-query attention)."""
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     diag: list[tuple[torch.Tensor, torch.Tensor]] = ()) -> torch.Tensor:
    """Softmax attention over context keys (boolean `mask` [B|1,1,Tq,S]) plus per-query "diagonal" keys.

    q [B,nh,Tq,hd]; k/v [B,nh,S,hd]; diag: (k_j, v_j) [B,nh,Tq,hd] where query t sees only row t.
    This is EAGLE-3's training-time-test attention without materialising the (steps x T) key axis.
    """
    if not diag:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale  # [B,nh,Tq,S]
    scores = scores.masked_fill(~mask, float("-inf"))
    diag_scores = torch.stack([(q * kj).sum(-1) for kj, _ in diag], dim=-1) * scale  # [B,nh,Tq,J]
    probs = torch.cat([scores, diag_scores], dim=-1).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    # split (not index) so the backward pass does not allocate a full-size gradient per slice
    p_ctx, p_diag = probs.split([k.shape[2], len(diag)], dim=-1)
    out = p_ctx @ v
    for j, (_, vj) in enumerate(diag):
        out = out + p_diag[..., j, None] * vj
    return out


def _document_spans(document_ids: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of equal document id in a packed row [1, T] (one span per row if B > 1)."""
    if document_ids.shape[0] != 1:
        raise ValueError("training batches are packed into one row (B = 1)")
    d = document_ids[0]
    cuts = ((d[1:] != d[:-1]).nonzero().flatten() + 1).tolist()
    bounds = [0, *cuts, d.numel()]
    return list(zip(bounds[:-1], bounds[1:]))


def _causal_mask(n: int, window: int | None, *, padding: bool, device) -> torch.Tensor:
    """[1,1,n,n] boolean: causal (within a sliding window when given); padding queries see only themselves."""
    idx = torch.arange(n, device=device)
    if padding:
        return torch.eye(n, dtype=torch.bool, device=device)[None, None]
    m = idx[None, :] <= idx[:, None]
    if window:
        m = m & (idx[None, :] > idx[:, None] - window)
    return m[None, None]


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


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft. `embed_tokens` is the verifier's (frozen, shared, not saved unless asked)."""

    def __init__(self, cfg: Eagle3Config, embed_tokens: nn.Embedding | None = None):
        super().__init__()
        self.config = cfg
        tlc = cfg.transformer_layer_config
        h = int(tlc["hidden_size"])
        eps = float(tlc.get("rms_norm_eps", 1e-6))
        self.hidden_size = h
        ids = cfg.eagle_aux_hidden_state_layer_ids
        self.num_aux = len(ids) if ids else 3
        ht = cfg.target_hidden_size or h
        self.fc = nn.Linear(self.num_aux * ht, h, bias=False)
        self.input_norm = RMSNorm(self.num_aux * ht, eps) if cfg.norm_before_fc else None
        self.fc_norm = nn.ModuleList([RMSNorm(ht, eps) for _ in range(self.num_aux)]) if cfg.fc_norm else None
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        vocab = cfg.vocab_size
        if cfg.reduced_vocab:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None
        self.embed_tokens = embed_tokens if embed_tokens is not None else nn.Embedding(vocab, h)
        self.embed_tokens.weight.requires_grad_(cfg.embed_requires_grad)
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.rotary_emb = LlamaRotaryEmbedding(_hf_layer_config(cfg))
        types = tlc.get("layer_types") or []
        window = tlc.get("sliding_window")
        self.windows = [window if i < len(types) and types[i] == "sliding_attention" else None
                        for i in range(cfg.num_layers)]
        nh = int(tlc["num_attention_heads"])
        self.kv_groups = nh // int(tlc.get("num_key_value_heads") or nh)

    # -- pieces --------------------------------------------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Aux target states [B,T,A*Ht] (ascending layer order) -> fused feature [B,T,H]."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, aux.chunk(self.num_aux, dim=-1))], dim=-1)
        return self.fc(aux)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder output [B,T,H] -> (hidden fed to the next step, logits [B,T,Vd])."""
        normed = self.norm(x)
        return (normed if self.config.norm_output else x), self.lm_head(normed)

    def _layers(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        with torch.no_grad() if not self.embed_tokens.weight.requires_grad else torch.enable_grad():
            embeds = self.embed_tokens(input_ids)
        x = torch.cat([embeds.to(hidden.dtype), hidden], dim=-1)  # [B,T,2H]
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, attend)
        return x

    # -- inference: one draft step over new positions, with a KV cache --------------------------
    def forward_cached(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                       cache: DraftCache, *, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B,T] (target vocab), hidden [B,T,H], positions [B,T] -> (next hidden [B,T,H], logits [B,T,Vd]).

        With `last_only` the head runs on the last position only (T -> 1 in both outputs); the cache still
        gets every position."""
        past = cache.length
        t = input_ids.shape[1]
        q_pos = past + torch.arange(t, device=input_ids.device)
        k_pos = torch.arange(past + t, device=input_ids.device)
        causal = k_pos[None, :] <= q_pos[:, None]  # [T,S]

        def attend(i, q, k, v):
            k_all, v_all = cache.append(i, k, v)
            mask = causal
            if self.windows[i]:
                mask = mask & (k_pos[None, :] > q_pos[:, None] - self.windows[i])
            return F.scaled_dot_product_attention(q, repeat_kv(k_all, self.kv_groups), repeat_kv(v_all, self.kv_groups),
                                                  attn_mask=mask[None, None])

        x = self._layers(input_ids, hidden, position_ids, attend)
        return self.head(x[:, -1:] if last_only else x)

    # -- training: all TTT steps over a packed sequence -----------------------------------------
    def ttt_forward(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                    document_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test. aux [B,T,A*Ht] features g_t, input_ids [B,T] tokens x_{t+1},
        position_ids [B,T] (t+1 within each document), document_ids [B,T] (-1 = padding).

        Step k feeds the ground-truth tokens shifted by k and the draft's own previous hidden; its query
        at t sees the step-0 keys of the same document at positions <= t plus its own keys of steps 1..k.
        Returns logits [B,T,Vd] per step; step k's logits at t predict the token at t+k+1 (aligned later).
        """
        b, t = input_ids.shape
        spans = _document_spans(document_ids)  # packed rows: attention never crosses documents
        masks = {w: [_causal_mask(e - s, w, padding=bool(document_ids[0, s] < 0), device=input_ids.device)
                     for s, e in spans] for w in set(self.windows)}
        ctx: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        diag: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in range(len(self.layers))}

        def segmented(q, k, v, window, diag_kv):
            """Attention document by document (the masked-out cross-document blocks are never computed)."""
            outs = [masked_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], m,
                                     [(kj[:, :, s:e], vj[:, :, s:e]) for kj, vj in diag_kv])
                    for (s, e), m in zip(spans, masks[window])]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

        hidden = self.fuse(aux)
        ids = input_ids
        logits_per_step = []
        for step in range(steps):
            def attend(i, q, k, v, step=step):
                k, v = repeat_kv(k, self.kv_groups), repeat_kv(v, self.kv_groups)
                if step == 0:
                    ctx[i] = (k, v)
                    return segmented(q, k, v, self.windows[i], [])
                diag[i].append((k, v))
                return segmented(q, *ctx[i], self.windows[i], diag[i])

            x = self._layers(ids, hidden, position_ids + step, attend)
            hidden, logits = self.head(x)
            logits_per_step.append(logits)
            # teacher forcing: the next step reads the true tokens one further ahead (right-padded with 0)
            ids = torch.cat([input_ids[:, step + 1:], input_ids.new_zeros(b, step + 1)], dim=1)
        return logits_per_step

    def forward(self, aux, input_ids, position_ids, document_ids, steps):  # the training entry point (DDP calls it)
        return self.ttt_forward(aux, input_ids, position_ids, document_ids, steps)

    # -- checkpoint helpers ---------------------------------------------------------------------
    def checkpoint_state(self, *, include_embeddings: bool = False) -> dict[str, torch.Tensor]:
        """Exactly the tensors vLLM loads (no rotary buffers, no training-only copies)."""
        out = {}
        for name, tensor in self.state_dict().items():
            if name.startswith("rotary_emb.") or (name == "embed_tokens.weight" and not include_embeddings):
                continue
            out[name] = tensor
        return out
