"""Load a target model and its tokenizer by built-in name, local folder or hub id (eval mode, no grads)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.errors import WorkbenchError
from engine.targets.capture import decoder_of
from engine.targets.dtypes import parse_dtype, pick_device
from engine.targets.resolve import TargetRef, resolve_target


@dataclass
class Target:
    """A loaded target model with its tokenizer and the identity drafts should record."""

    model: nn.Module
    tokenizer: object | None
    ref: TargetRef
    extra: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def text_config(self):
        cfg = self.model.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    @property
    def num_layers(self) -> int:
        return int(self.text_config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.vocab_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def verifier_name(self) -> str:
        """The name a draft's `verifier.name_or_path` should carry: the hub id when known."""
        return self.ref.hub_id or self.ref.path

    def decoder(self) -> nn.Module:
        return decoder_of(self.model)

    def layers(self) -> nn.ModuleList:
        return self.decoder().layers

    def final_norm(self) -> nn.Module:
        return self.decoder().norm

    def embed_tokens(self) -> nn.Module:
        """The token embedding as vLLM shares it with a draft: the plain lookup. A family's embedding scale (Gemma's
        sqrt(H) normalizer) is part of the target's own forward in vLLM; transformers folds it into the embedding
        module, so such a module is replaced by a plain lookup over the same weight (what training reads too)."""
        emb = self.model.get_input_embeddings()
        if type(emb) is nn.Embedding:
            return emb
        plain = self.extra.get("plain_embedding")
        if plain is None or plain.weight.data_ptr() != emb.weight.data_ptr() or plain.weight.dtype != emb.weight.dtype:
            plain = nn.Embedding.from_pretrained(emb.weight.detach(), freeze=True)
            self.extra["plain_embedding"] = plain
        return plain

    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

def load_target(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | None = None,
    with_tokenizer: bool = True,
) -> Target:
    """Load a target by built-in name (default), local folder or hub id; eval mode, no grads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = resolve_target(name_or_path)
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(ref.path) if with_tokenizer else None
    except OSError as exc:
        raise WorkbenchError(
            f"could not load target '{ref.name}': {exc}",
            hint="use the built-in 'smollm2-135m-instruct', a local model folder, or a hub id that is "
            "already in the Hugging Face cache (this machine may be offline)",
        ) from exc
    model.to(pick_device(device)).eval().requires_grad_(False)
    return Target(model=model, tokenizer=tokenizer, ref=ref)
