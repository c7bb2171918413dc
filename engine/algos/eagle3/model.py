"""The EAGLE-3 draft model: fused aux features + token embedding -> decoder layer(s) -> draft-vocab logits.

Tensor names match speculators 0.9.0 and vLLM 0.33 (`fc`, `layers.{i}.*`, `layers.0.hidden_norm`,
`norm`, `lm_head`, `input_norm`, `fc_norm.{i}`, `d2t`, `t2d`). The same weights compute the same
logits as speculators' `Eagle3DraftModel` (tested against it).

Notation: B batch, T tokens, H draft hidden, Ht target hidden, A aux layers, Vd draft vocab,
V target vocab, nh/nkv heads, hd head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.algos.common.layers import (
    Attend,
    DecoderLayer,
    DraftCache,
    LayerDims,
    RMSNorm,
    cached_attend,
    causal_mask,
    document_spans,
    layer_windows,
    repeat_kv,
    rotary_embedding,
)
from engine.algos.eagle3.config import Eagle3Config


class Eagle3Layer(DecoderLayer):
    """A Llama/Qwen3 decoder layer; the first EAGLE-3 layer takes [embedding; hidden] (2H) instead of H."""

    def __init__(self, cfg: Eagle3Config, index: int):
        dims = LayerDims.from_config(cfg.transformer_layer_config)
        super().__init__(dims, index, attn_in_dim=2 * dims.hidden if index == 0 else None)
        self.first = index == 0
        self.norm_before_residual = cfg.norm_before_residual
        if self.first:
            self.hidden_norm = RMSNorm(dims.hidden, dims.eps)

    def attention_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.first:
            return super().attention_input(x)
        # x = [embedding; hidden] [B,T,2H]: the residual stream is the hidden half.
        embeds, hidden = x.split(self.hidden, dim=-1)
        residual = hidden
        hidden = self.hidden_norm(hidden)
        if self.norm_before_residual:
            residual = hidden
        return residual, torch.cat([self.input_layernorm(embeds), hidden], dim=-1)


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
        self.layers = nn.ModuleList([Eagle3Layer(cfg, i) for i in range(cfg.num_layers)])
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
        self.rotary_emb = rotary_embedding(tlc)
        self.windows = layer_windows(tlc, cfg.num_layers)
        nh = int(tlc["num_attention_heads"])
        self.kv_groups = nh // int(tlc.get("num_key_value_heads") or nh)

    # -- pieces --------------------------------------------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Aux target states [B,T,A*Ht] (ascending layer order) -> fused feature [B,T,H]."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, aux.chunk(self.num_aux, dim=-1), strict=True)], dim=-1)
        return self.fc(aux)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder output [B,T,H] -> (hidden fed to the next step, logits [B,T,Vd])."""
        normed = self.norm(x)
        return (normed if self.config.norm_output else x), self.lm_head(normed)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [B,T] -> [B,T,H] (no graph through a frozen shared table). Drafts with trainable
        rows (P-EAGLE's mask token) override this."""
        with torch.no_grad() if not self.embed_tokens.weight.requires_grad else torch.enable_grad():
            return self.embed_tokens(input_ids)

    def _layers(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        x = torch.cat([self.embed(input_ids).to(hidden.dtype), hidden], dim=-1)  # [B,T,2H]
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
        attend = cached_attend(cache, self.windows, self.kv_groups, input_ids.shape[1], input_ids.device)
        x = self._layers(input_ids, hidden, position_ids, attend)
        return self.head(x[:, -1:] if last_only else x)

    # -- training: all TTT steps over a packed sequence -----------------------------------------
    def ttt_forward(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                    document_ids: torch.Tensor, steps: int, own_tokens: bool = False) -> list[torch.Tensor]:
        """Training-time test. aux [B,T,A*Ht] features g_t, input_ids [B,T] tokens x_{t+1},
        position_ids [B,T] (t+1 within each document), document_ids [B,T] (-1 = padding).

        Step k feeds the ground-truth tokens shifted by k and the draft's own previous hidden; its query
        at t sees the step-0 keys of the same document at positions <= t plus its own keys of steps 1..k.
        Returns logits [B,T,Vd] per step; step k's logits at t predict the token at t+k+1 (aligned later).
        """
        # own_tokens: step k feeds the draft's own greedy token of step k-1 at each t instead (what cached decoding
        # feeds, also after a wrong draft; the evaluator reads a chain's confidences so)
        b, t = input_ids.shape
        spans = document_spans(document_ids)  # packed rows: attention never crosses documents
        masks = {w: [causal_mask(e - s, w, padding=bool(document_ids[0, s] < 0), device=input_ids.device)
                     for s, e in spans] for w in set(self.windows)}
        ctx: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        diag: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in range(len(self.layers))}

        def segmented(q, k, v, window, diag_kv):
            """Attention document by document (the masked-out cross-document blocks are never computed)."""
            outs = [masked_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], m,
                                     [(kj[:, :, s:e], vj[:, :, s:e]) for kj, vj in diag_kv])
                    for (s, e), m in zip(spans, masks[window], strict=True)]
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
            if own_tokens:  # row t's chain goes on from its own draft, as decoding's does
                ids = self.draft_to_target(logits.argmax(-1))
            else:  # teacher forcing: the next step reads the true tokens one further ahead (right-padded with 0)
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
