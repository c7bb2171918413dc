"""Build a fresh P-EAGLE draft for a target, and load/save P-EAGLE checkpoints in the speculators layout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.algos.common.layers import module_to_dtype_except
from engine.algos.common.vocab import choose_mask_token, selected_from_d2t, vocab_maps
from engine.algos.eagle3.io import eagle_draft_config, init_from_target
from engine.algos.peagle.args import PEagleArgs
from engine.algos.peagle.config import PEagleConfig
from engine.algos.peagle.model import PEagleDraft
from engine.errors import WorkbenchError
from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint
from engine.format.config import parse_draft_config

# speculators' initialisation leaves these alone: the shared table, its trained row (a copy of the target's)
# and mask_hidden (N(0, 1), as speculators draws it)
_NOT_INITIALISED = ("embed_tokens", "mask_embedding", "mask_hidden")


def build_peagle(target, args: PEagleArgs | None = None, *, aux_layer_ids: list[int] | None = None,
                 token_counts: torch.Tensor | None = None, seed: int = 0) -> PEagleDraft:
    """A new P-EAGLE draft for `target` (an engine.targets.loading.Target or VerifierParts), shaped by `args`,
    initialised like speculators.

    As EAGLE-3: the draft vocabulary is the top `draft_vocab_size` tokens of `token_counts`, `lm_head` starts as
    the verifier's rows for them, and the token embedding is the verifier's (frozen, but for the mask token's row)."""
    a = args or PEagleArgs()
    cfg = eagle_draft_config("peagle", PEagleConfig, target, a, aux_layer_ids,
                             mask_token_id=choose_mask_token(target, a.mask_token_id))
    torch.manual_seed(seed)
    draft = PEagleDraft(cfg, embed_tokens=target.embed_tokens())
    return init_from_target(draft, target, cfg.draft_vocab_size, target.vocab_size, token_counts,
                            skip=_NOT_INITIALISED)


def load_peagle(path: str | os.PathLike, target=None, *, allow_pickle: bool = False,
                dtype: torch.dtype = torch.float32) -> PEagleDraft:
    """Load a P-EAGLE checkpoint (ours or speculators'): its own `embed_tokens` table (the mask row trained)."""
    folder = Path(path)
    cfg = parse_draft_config(read_config_dict(folder))
    if not isinstance(cfg, PEagleConfig):
        raise WorkbenchError(f"{folder} is a '{cfg.speculators_model_type}' draft, not peagle",
                             hint="pick a P-EAGLE draft for this proposer")
    if cfg.mask_token_id is None:
        raise WorkbenchError(f"{folder}: mask_token_id is missing or null", where="config.json",
                             hint="set it to the token id the draft's parallel slots were trained with")
    if target is not None and target.hidden_size != (cfg.target_hidden_size or cfg.hidden_size):
        raise WorkbenchError(f"the draft expects target hidden size {cfg.target_hidden_size or cfg.hidden_size}, "
                             f"the target has {target.hidden_size}", hint="pair the draft with its own verifier")
    state = load_state_dict(folder, allow_pickle=allow_pickle)
    state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    if "embed_tokens.weight" in state:
        table = state["embed_tokens.weight"].float()
        embed = nn.Embedding(*table.shape, _weight=table.clone())
    elif target is not None:  # vLLM shares the target's table then; the mask row is the target's own
        embed = target.embed_tokens()
    else:
        raise WorkbenchError(f"{folder} has no embed_tokens and no target was given", hint="pass the target model")
    draft = PEagleDraft(cfg, embed_tokens=embed)
    expected = set(draft.checkpoint_state()) - {"embed_tokens.weight"}
    if draft.t2d is not None and "t2d" not in state and "d2t" in state:
        state["t2d"] = vocab_maps(selected_from_d2t(state["d2t"]), cfg.vocab_size)[1]
    missing = sorted(expected - set(state))
    extra = sorted(set(state) - expected - {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"})
    if missing or extra:
        raise WorkbenchError(f"checkpoint tensors do not match the config: missing {missing[:5]}, unexpected "
                             f"{extra[:5]}", where=str(folder), hint=f"run `python -m engine validate {folder}`")
    own = {k: v for k, v in state.items() if k in expected}
    own["mask_hidden"] = own["mask_hidden"].reshape(draft.mask_hidden.shape)  # vLLM accepts any shape of A*Ht
    draft.load_state_dict(own, strict=False)
    with torch.no_grad():
        draft.mask_embedding.copy_(draft.embed_tokens.weight[draft.mask_token_id])
    module_to_dtype_except(draft, dtype, keep=() if "embed_tokens.weight" in state else ("embed_tokens",))
    draft.mask_embedding.data = draft.mask_embedding.data.to(dtype)
    draft.mask_hidden.data = draft.mask_hidden.data.to(dtype)
    return draft.eval()


def save_peagle(draft: PEagleDraft, path: str | os.PathLike, *, dtype: torch.dtype | None = torch.bfloat16,
                config_updates: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors exactly as vLLM loads them (atomic)."""
    cfg = draft.config.to_dict()
    cfg["architectures"] = ["PEagleDraftModel"]  # what speculators' trainer writes for trained drafts
    cfg.update(config_updates or {})
    return save_checkpoint(path, cfg, draft.checkpoint_state(), dtype=dtype)
