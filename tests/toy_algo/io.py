"""Build a fresh toy head for a target, and load/save it (config.json + model.safetensors)."""

from __future__ import annotations

import torch
from torch import nn

from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint
from engine.format.config import ProposalMethod, SpeculatorsInfo, VerifierInfo

from .config import ToyConfig
from .model import ToyHead


def build_toy(target, args, *, aux_layer_ids: list[int], token_counts=None, seed: int = 0) -> ToyHead:
    """A fresh toy head (`args`: its ToyArgs; the toy drafts the full vocabulary, so token_counts is unused)."""
    h, v = target.hidden_size, target.vocab_size
    cfg = ToyConfig(
        speculators_config=SpeculatorsInfo(algorithm="toy", proposal_methods=[ProposalMethod(speculative_tokens=1)],
                                           verifier=VerifierInfo(name_or_path=target.verifier_name)),
        transformer_layer_config={"hidden_size": h, "vocab_size": v, "num_attention_heads": 1,
                                  "intermediate_size": h, "model_type": "llama"},
        aux_hidden_state_layer_ids=aux_layer_ids, target_hidden_size=h, draft_vocab_size=v)
    torch.manual_seed(seed)
    draft = ToyHead(cfg)
    nn.init.normal_(draft.head.weight, std=args.toy_init_std)
    nn.init.zeros_(draft.head.bias)
    return draft


def load_toy(path, target=None, *, allow_pickle: bool = False, dtype: torch.dtype = torch.float32) -> ToyHead:
    draft = ToyHead(ToyConfig.model_validate(read_config_dict(path)))
    draft.load_state_dict({k: v.to(dtype) for k, v in load_state_dict(path, allow_pickle=allow_pickle).items()})
    return draft.eval()


def save_toy(draft: ToyHead, path, *, dtype: torch.dtype | None = None, config_updates=None):
    return save_checkpoint(path, {**draft.config.to_dict(), **(config_updates or {})}, draft.state_dict(),
                           dtype=dtype)
