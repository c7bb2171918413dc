"""DSpark in the layout of vLLM's `Gemma4DSparkModel`, the class vLLM runs beside Gemma 4 targets."""

# Tensors (vLLM's Gemma4DSparkForCausalLM prefixes `model.` to every name but lm_head):
#   fc.weight [H, A*Ht], hidden_norm.weight [H], norm.weight [H], embed_tokens.weight [V, H], lm_head.weight [V, H];
#   layers.{i}.{input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm}
#   .weight [H], layers.{i}.layer_scalar [1], layers.{i}.self_attn.{q_proj [nh*hd, H], k_proj [nkv*hd, H],
#   o_proj [H, nh*hd], q_norm [hd], k_norm [hd]}.weight, layers.{i}.mlp.{gate_proj, up_proj [I, H], down_proj [H, I]}
#   .weight; markov_head.* and confidence_head.* as DSpark's.
# A layer, x [B, T, H] (every layer full attention with keys equal to values, as vLLM's fused context path assumes):
#   h = n1(x);  k0 = k_proj(h);  q = rope(q_norm(q_proj(h)));  k = rope(k_norm(k0));  v = rms(k0)   (v: no weight)
#   x = x + n2(o_proj(attn(q, k, v)))      attention scale 1 (the q/k norms set the scale)
#   x = (x + n4(mlp(n3(x)))) * layer_scalar,   mlp(h) = down(gelu_tanh(gate(h)) * up(h))
# The block enters as embed(ids) * sqrt(H); the head's logits and the Markov bias are each soft-capped when the
# config has `final_logit_softcapping` (vLLM runs both through the same LogitsProcessor).
# vLLM loads it from a folder in its own form (vllm_form.py).

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.algos.common.layers import MLP, LayerDims, RMSNorm, rms, rotate_half
from engine.algos.dspark.model import DSparkDraft
from engine.algos.dspark.vllm_form import ACTIVATION, GEMMA4_LAYOUT, layout_problems
from engine.errors import WorkbenchError


def gemma4_layer_config(target_config: Any, num_layers: int) -> dict[str, Any]:
    """The draft decoder's Gemma 4 text config from the target's: its widths and heads, every layer full attention
    with keys equal to values, plain RoPE at the target's global theta, the target's logit soft-cap."""
    src = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    src = src.get("text_config") or src
    h, nh = int(src["hidden_size"]), int(src["num_attention_heads"])
    hd = int(src.get("head_dim") or h // nh)
    nkv = int(src.get("num_key_value_heads") or nh)
    rope = src.get("rope_parameters") or {}
    full = rope.get("full_attention", rope) if isinstance(rope, dict) else {}
    theta = float(full.get("rope_theta") or src.get("rope_theta") or 1_000_000.0)
    return {"model_type": GEMMA4_LAYOUT, "hidden_size": h, "intermediate_size": int(src["intermediate_size"]),
            "num_hidden_layers": num_layers, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
            "global_head_dim": hd, "num_global_key_value_heads": nkv, "attention_k_eq_v": True,
            "layer_types": ["full_attention"] * num_layers, "sliding_window": int(src.get("sliding_window") or 512),
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": theta},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
            "hidden_activation": ACTIVATION, "rms_norm_eps": float(src.get("rms_norm_eps", 1e-6)),
            "max_position_embeddings": int(src.get("max_position_embeddings") or 131_072),
            "vocab_size": int(src["vocab_size"]), "final_logit_softcapping": src.get("final_logit_softcapping"),
            "attention_bias": False, "tie_word_embeddings": False}


def check_layer_config(tlc: dict[str, Any]) -> None:
    """Refuse a Gemma 4 layer config this layout cannot compute as vLLM does (say which field, and why)."""
    problems = layout_problems(tlc)
    if problems:
        where, why, _ = problems[0]
        raise WorkbenchError(why, where=where)


class NeoxRotary(nn.Module):
    """cos/sin of the default (neox-style) RoPE: x [B,T,*], positions [B,T] -> ([B,T,hd], [B,T,hd])."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq.to(x.device)         # [B, T, hd/2]
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Gemma4Attention(nn.Module):
    """Q/K projections with their norms; values are the weightless-normed key projection (attention_k_eq_v)."""

    def __init__(self, dims: LayerDims):
        super().__init__()
        self.nh, self.nkv, self.hd, self.eps = dims.heads, dims.kv_heads, dims.head_dim, dims.eps
        self.q_proj = nn.Linear(dims.hidden, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(dims.hidden, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, dims.hidden, bias=False)
        self.q_norm = RMSNorm(self.hd, dims.eps)
        self.k_norm = RMSNorm(self.hd, dims.eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,H] -> k (RoPE applied), v [B,nkv,T,hd]."""
        b, t, _ = x.shape
        k0 = self.k_proj(x).view(b, t, self.nkv, self.hd)
        k = self.k_norm(k0).transpose(1, 2)
        v = rms(k0, self.eps).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return k * cos + rotate_half(k) * sin, v

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B,T,H] -> q [B,nh,T,hd] (times sqrt(hd): the caller's attention divides by it, vLLM's scale is 1),
        k/v [B,nkv,T,hd]."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.hd)).transpose(1, 2)
        q = q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
        k, v = self.kv(x, cos, sin)
        return q * math.sqrt(self.hd), k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B,nh,T,hd] -> [B,T,H]."""
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Gemma4DraftLayer(nn.Module):
    """vLLM's Gemma4DSparkDecoderLayer: four norms around attention and MLP, then the layer scalar."""

    def __init__(self, dims: LayerDims, index: int):
        super().__init__()
        self.index = index
        self.self_attn = Gemma4Attention(dims)
        self.mlp = MLP(dims.hidden, dims.intermediate, act=gelu_tanh)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(dims.hidden, dims.eps))
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)
        x = x + self.post_attention_layernorm(self.self_attn.out(attend(self.index, q, k, v)))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar.to(x.dtype)


class Gemma4DSparkDraft(DSparkDraft):
    """DSpark with Gemma 4 layers, a scaled embedding and its own copies of the target's embedding and head."""

    def __init__(self, cfg, embed_tokens: nn.Embedding, lm_head_weight: torch.Tensor | None = None):
        check_layer_config(cfg.transformer_layer_config)
        if cfg.reduced_vocab:
            raise WorkbenchError("a Gemma 4 DSpark draft drafts over the full vocabulary: vLLM's "
                                 "Gemma4DSparkForCausalLM has no draft-to-target map",
                                 hint="leave --draft-vocab-size unset, or use --draft-layout qwen3")
        super().__init__(cfg, embed_tokens, lm_head_weight)
        self.softcap = cfg.transformer_layer_config.get("final_logit_softcapping")

    def make_layer(self, dims: LayerDims, index: int) -> Gemma4DraftLayer:
        return Gemma4DraftLayer(dims, index)

    def make_rotary(self, tlc: dict[str, Any]) -> nn.Module:
        return NeoxRotary(int(tlc["head_dim"]), float(tlc["rope_parameters"]["full_attention"]["rope_theta"]))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [..] -> embed(ids) * sqrt(H) [.., H], the normalizer rounded to the weights' dtype as vLLM's is."""
        dtype = self.fc.weight.dtype
        return self.embed_tokens(ids).to(dtype) * torch.tensor(self.hidden_size ** 0.5, dtype=dtype)

    def cap(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if not self.softcap else torch.tanh(logits / self.softcap) * self.softcap

    def project(self, hn: torch.Tensor) -> torch.Tensor:
        return self.cap(super().project(hn))

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Self-contained, as vLLM's Gemma 4 class loads it: the backbone and heads plus the embedding and head."""
        head = self.target_head  # a tied target shares one tensor: safetensors stores each name on its own
        if head.data_ptr() == self.embed_tokens.weight.data_ptr():
            head = head.clone()
        return {**super().checkpoint_state(), "embed_tokens.weight": self.embed_tokens.weight.detach(),
                "lm_head.weight": head}

    @staticmethod
    def shared_copies() -> set[str]:
        return {"embed_tokens.weight", "lm_head.weight"}
