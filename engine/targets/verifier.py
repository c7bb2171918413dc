"""The few verifier tensors a draft shares (embedding, lm_head, final norm), read without instantiating the target."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.errors import WorkbenchError
from engine.targets.loading import Target
from engine.targets.resolve import TargetRef, resolve_target
from engine.weightfiles import weight_files

# model types whose RMSNorm scales by (1 + w), as speculators' verifier_norm picks Gemma3RMSNorm for them, and the
# Gated DeltaNet families speculators' list misses (their final norm is (1 + w) too; tests/engine/test_family_details)
ONE_PLUS_W_NORM_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_5", "qwen3_5_text",
                                   "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "recurrent_gemma"})


@dataclass
class VerifierParts:
    """Embedding, lm_head and final norm of a target, read straight from its safetensors files.

    Quacks like `Target` for draft construction and training targets (no decoder layers loaded).
    """

    ref: TargetRef
    config: object
    embed: nn.Embedding
    head_weight: torch.Tensor  # [V, H]
    norm_weight: torch.Tensor  # [H]
    norm_eps: float

    @property
    def text_config(self):
        return self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config

    num_layers = Target.num_layers
    hidden_size = Target.hidden_size
    vocab_size = Target.vocab_size
    verifier_name = Target.verifier_name

    def embed_tokens(self) -> nn.Embedding:
        return self.embed

    def lm_head(self) -> nn.Linear:
        head = nn.Linear(self.head_weight.shape[1], self.head_weight.shape[0], bias=False)
        head.weight = nn.Parameter(self.head_weight, requires_grad=False)
        return head

    def final_norm_fn(self):
        """RMSNorm with the verifier's weight (fp32 compute), as a function [.., H] -> [.., H]. Families whose norm
        scales by (1 + w) (Gemma; speculators' `verifier_norm` rule) get that convention."""
        w, eps = self.norm_weight, self.norm_eps
        if getattr(self.text_config, "model_type", None) in ONE_PLUS_W_NORM_TYPES:
            w = 1.0 + w.float()

        def norm(x: torch.Tensor) -> torch.Tensor:
            dtype = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return w.to(x.device) * x.to(dtype)
        return norm

    def logit_transform(self):
        """What the family's own forward does to lm_head's output, as a function on logits: Granite divides by
        `logits_scaling`, Gemma 2 soft-caps (tanh(x / c) * c with `final_logit_softcapping`); identity elsewhere.
        Both keep the argmax, but not the distribution training matches."""
        scale = getattr(self.text_config, "logits_scaling", None)
        cap = getattr(self.text_config, "final_logit_softcapping", None)

        def transform(logits: torch.Tensor) -> torch.Tensor:
            if scale:
                logits = logits / scale
            if cap:
                logits = torch.tanh(logits / cap) * cap
            return logits
        return transform


def _find_tensor(names: Iterable[str], *suffixes: str) -> str | None:
    names = list(names)
    for suffix in suffixes:
        exact = [n for n in names if n == suffix]
        if exact:
            return exact[0]
        ends = sorted((n for n in names if n.endswith("." + suffix) and "mtp" not in n), key=len)
        if ends:
            return ends[0]
    return None


def load_verifier_parts(name_or_path: str | os.PathLike | None = None, *,
                        target: Target | None = None) -> VerifierParts:
    """Embedding, lm_head (or the tied embedding) and final norm of a target, from a loaded target or its files."""
    if target is not None:
        cfg = target.text_config
        norm = target.final_norm()
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", cfg.rms_norm_eps)))
        return VerifierParts(target.ref, target.config, target.embed_tokens(), target.lm_head().weight.detach(),
                             norm.weight.detach(), eps)
    from safetensors import safe_open
    from transformers import AutoConfig

    ref = resolve_target(name_or_path)
    if not Path(ref.path).is_dir():
        raise WorkbenchError(f"target '{ref.name}' is not available locally",
                             hint="use a local folder, the built-in target, or a hub id already in the HF cache")
    config = AutoConfig.from_pretrained(ref.path)
    files = weight_files(ref.path)
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            where.update({k: f for k in h.keys()})

    def get(*suffixes: str) -> torch.Tensor | None:
        name = _find_tensor(where, *suffixes)
        if name is None:
            return None
        with safe_open(str(where[name]), framework="pt") as h:
            return h.get_tensor(name).float()

    embed_w = get("embed_tokens.weight", "tok_embeddings.weight", "wte.weight")
    head_w = get("lm_head.weight", "output.weight")
    norm_w = get("model.norm.weight", "norm.weight", "norm_f.weight")
    if embed_w is None or norm_w is None:
        raise WorkbenchError(f"could not find the embedding/final norm tensors in {ref.path}",
                             hint="the target's safetensors must hold embed_tokens and the final norm")
    if head_w is None:
        head_w = embed_w  # tied embeddings
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    embed = nn.Embedding.from_pretrained(embed_w, freeze=True)
    return VerifierParts(ref, config, embed, head_w, norm_w, float(getattr(text, "rms_norm_eps", 1e-6)))
