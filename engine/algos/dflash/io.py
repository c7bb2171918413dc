"""Build a fresh DFlash draft for a target, and load/save DFlash checkpoints in the speculators layout."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.algos.base import DecoderArgs
from engine.algos.common.layers import init_draft_weights, module_to_dtype_except
from engine.algos.common.vocab import choose_mask_token, reduced_vocab, selected_from_d2t, vocab_maps
from engine.algos.dflash.args import DFlashArgs
from engine.algos.dflash.config import DFlashConfig
from engine.algos.dflash.model import DFlashDraft
from engine.errors import WorkbenchError
from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint
from engine.format.config import build_draft_config, build_layer_config, parse_draft_config


@dataclass(frozen=True)
class FamilyMember:
    """A draft type built on DFlash's backbone: its format name, its model class and its own config fields."""

    algorithm: str = "dflash"
    draft_class: type[DFlashDraft] = DFlashDraft
    config_fields: dict[str, Any] = field(default_factory=dict)  # e.g. sample_from_anchor, DSpark's heads
    layer_config: dict[str, Any] | None = None  # its own transformer_layer_config (None: Qwen3 layers)


def build_dflash(target, args: DecoderArgs | None = None, *, aux_layer_ids: list[int] | None = None,
                 token_counts: torch.Tensor | None = None, seed: int = 0, member: FamilyMember | None = None
                 ) -> DFlashDraft:
    """A new DFlash-family draft for `target` (an engine.targets.loading.Target or VerifierParts), shaped by `args` (a
    family member's: block_size, block_causal, mask_token_id), initialised like speculators; `member` builds
    another type of the family on the same backbone."""
    a, member = args or DFlashArgs(), member or FamilyMember()
    vocab = target.vocab_size
    draft_vocab_size = getattr(a, "draft_vocab_size", None) or vocab  # DFlash2 drafts over the full vocabulary
    fields = {"sample_from_anchor": False, **member.config_fields}
    aux = sorted(aux_layer_ids or DFlashConfig.default_aux_layer_ids(target.num_layers))
    layer_config = member.layer_config or build_layer_config(target.text_config, model_type="qwen3",
                                                             num_layers=a.num_layers, sliding_window=a.sliding_window)
    cfg = build_draft_config(
        member.algorithm, verifier_config=target.text_config, verifier_name=target.verifier_name,
        layer_config=layer_config, draft_vocab_size=draft_vocab_size, block_size=a.block_size,
        speculative_tokens=a.speculative_tokens or DFlashConfig.default_speculative_tokens({**a.model_dump(),
                                                                                           **fields}),
        aux_hidden_state_layer_ids=aux, mask_token_id=choose_mask_token(target, a.mask_token_id),
        sliding_window_non_causal=not a.block_causal, **fields)
    cfg.speculators_config.verifier.architectures = list(getattr(target.config, "architectures", None) or [])
    head = target.lm_head().weight.detach()  # [V, H]
    torch.manual_seed(seed)
    draft = member.draft_class(cfg, embed_tokens=target.embed_tokens(),
                               lm_head_weight=head if draft_vocab_size == vocab else None)
    init_draft_weights(draft, std=float(target.text_config.to_dict().get("initializer_range", 0.02)))
    if draft_vocab_size != vocab:
        selected, d2t, t2d = reduced_vocab(token_counts, draft_vocab_size, vocab)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
        with torch.no_grad():
            draft.lm_head.weight.copy_(head[selected])
    return draft


def load_dflash(path: str | os.PathLike, target, *, allow_pickle: bool = False,
                dtype: torch.dtype = torch.float32, algorithm: str = "dflash",
                draft_class: type[DFlashDraft] = DFlashDraft) -> DFlashDraft:
    """Load a DFlash-family checkpoint (ours or speculators'; `algorithm` its type, `draft_class` its model); the
    target supplies the embedding (and the full-vocab head)."""
    folder = Path(path)
    cfg = parse_draft_config(read_config_dict(folder))
    if not isinstance(cfg, DFlashConfig) or cfg.speculators_model_type != algorithm:
        raise WorkbenchError(f"{folder} is a '{cfg.speculators_model_type}' draft, not {algorithm}")
    if target is None:
        raise WorkbenchError(f"{folder}: a {algorithm} draft shares its target's embedding",
                             hint="pass the target model")
    if target.hidden_size != (cfg.target_hidden_size or cfg.hidden_size):
        raise WorkbenchError(f"the draft expects target hidden size {cfg.target_hidden_size or cfg.hidden_size}, "
                             f"the target has {target.hidden_size}", hint="pair the draft with its own verifier")
    state = load_state_dict(folder, allow_pickle=allow_pickle)
    embed = target.embed_tokens()
    head = None if cfg.reduced_vocab else target.lm_head().weight.detach()
    if not cfg.reduced_vocab and "lm_head.weight" in state:  # a full-vocab head of its own (earlier speculators)
        head = state.pop("lm_head.weight")
    draft = draft_class(cfg, embed_tokens=embed, lm_head_weight=head)
    expected = set(draft.checkpoint_state()) - draft.shared_copies()
    if draft.t2d is not None and "t2d" not in state and "d2t" in state:
        state["t2d"] = vocab_maps(selected_from_d2t(state["d2t"]), cfg.vocab_size)[1]
    extra = sorted(set(state) - expected - {"embed_tokens.weight", "verifier_lm_head.weight",
                                             "verifier_norm.weight"})
    missing = sorted(expected - set(state))
    if missing or extra:
        raise WorkbenchError(f"checkpoint tensors do not match the config: missing {missing[:5]}, unexpected "
                             f"{extra[:5]}", where=str(folder), hint=f"run `python -m engine validate {folder}`")
    draft.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    module_to_dtype_except(draft, dtype)
    if draft.lm_head is None:  # the target's head as a buffer (a draft vocabulary has its own lm_head)
        draft.target_head = draft.target_head.to(dtype)
    return draft.eval()


def save_dflash(draft: DFlashDraft, path: str | os.PathLike, *, dtype: torch.dtype | None = torch.bfloat16,
                config_updates: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors exactly as vLLM loads them (atomic)."""
    cfg = draft.config.to_dict()
    cfg.update(config_updates or {})
    return save_checkpoint(path, cfg, draft.checkpoint_state(), dtype=dtype)
