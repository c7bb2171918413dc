"""Build a fresh EAGLE-3 draft for a target, and load/save EAGLE-3 checkpoints in the speculators layout."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine.algos.common.layers import init_draft_weights, module_to_dtype_except
from engine.algos.common.vocab import reduced_vocab, selected_from_d2t, vocab_maps
from engine.algos.eagle3.args import Eagle3Args
from engine.algos.eagle3.config import Eagle3Config
from engine.algos.eagle3.model import Eagle3Draft
from engine.errors import WorkbenchError
from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint
from engine.format.config import build_draft_config, build_layer_config, parse_draft_config


def build_eagle3(target, args: Eagle3Args | None = None, *, aux_layer_ids: list[int] | None = None,
                 token_counts: torch.Tensor | None = None, seed: int = 0) -> Eagle3Draft:
    """A new draft for `target` (an engine.targets.loading.Target), shaped by `args`, initialised like speculators
    0.9.0.

    The draft vocabulary is the top `draft_vocab_size` tokens of `token_counts` (loss-masked token
    frequencies); `lm_head` starts as the verifier's rows for those tokens; the token embedding is
    the verifier's, shared and frozen.
    """
    a = args or Eagle3Args()
    cfg = eagle_draft_config("eagle3", Eagle3Config, target, a, aux_layer_ids)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg, embed_tokens=target.embed_tokens())
    return init_from_target(draft, target, cfg.draft_vocab_size, target.vocab_size, token_counts)


def eagle_draft_config(algo: str, config_cls, target, a, aux_layer_ids: list[int] | None, **extra):
    """The speculators config of an EAGLE-3-shaped draft (`algo` eagle3 or peagle) for `target`, shaped by its args
    `a`: its decoder layers after the target's, the aux layer ids, the draft vocabulary and the norms."""
    aux = sorted(aux_layer_ids or config_cls.default_aux_layer_ids(target.num_layers))
    layer_config = build_layer_config(target.text_config, model_type=a.draft_arch, num_layers=a.num_layers,
                                      sliding_window=a.sliding_window)
    if a.draft_arch == "llama" and len(aux) != 3:
        layer_config["num_aux_hidden_states"] = len(aux)  # vLLM's Llama EAGLE-3 class ignores top-level ids
    cfg = build_draft_config(
        algo, verifier_config=target.text_config, verifier_name=target.verifier_name,
        layer_config=layer_config, draft_vocab_size=a.draft_vocab_size or target.vocab_size,
        eagle_aux_hidden_state_layer_ids=aux,
        speculative_tokens=a.speculative_tokens or config_cls.default_speculative_tokens(a.model_dump()),
        norm_before_residual=a.norm_before_residual, norm_before_fc=a.norm_before_fc, fc_norm=a.fc_norm,
        norm_output=a.norm_output, **extra,
    )
    cfg.speculators_config.verifier.architectures = list(getattr(target.config, "architectures", None) or [])
    return cfg


def init_from_target(draft, target, draft_vocab_size: int, vocab: int, token_counts,
                     skip: tuple[str, ...] = ("embed_tokens",)):
    """Random-initialise a new EAGLE-3-family draft (except `skip`), then copy the target's lm_head rows of the
    draft vocabulary (and its d2t/t2d maps) into it."""
    init_draft_weights(draft, std=float(target.text_config.to_dict().get("initializer_range", 0.02)), skip=skip)
    head = target.lm_head().weight.detach()  # [V, H] (tied to the embedding for SmolLM2)
    if draft_vocab_size != vocab:
        selected, d2t, t2d = reduced_vocab(token_counts, draft_vocab_size, vocab)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
        head = head[selected]
    with torch.no_grad():
        draft.lm_head.weight.copy_(head)
    return draft


def load_eagle3(path: str | os.PathLike, target=None, *, allow_pickle: bool = False,
                dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Load an EAGLE-3 checkpoint (ours, speculators', or converted with `midlayer.*`)."""
    folder = Path(path)
    cfg = parse_draft_config(read_config_dict(folder))
    if not isinstance(cfg, Eagle3Config) or cfg.speculators_model_type != "eagle3":
        raise WorkbenchError(f"{folder} is a '{cfg.speculators_model_type}' draft, not eagle3",
                             hint="pick an EAGLE-3 draft for this proposer")
    state = load_state_dict(folder, allow_pickle=allow_pickle)
    state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    embed = None
    if "embed_tokens.weight" not in state:
        if target is None:
            raise WorkbenchError(f"{folder} has no embed_tokens; the draft needs its target to share embeddings",
                                 hint="pass the target model")
        embed = target.embed_tokens()
    draft = Eagle3Draft(cfg, embed_tokens=embed)
    if target is not None and target.hidden_size != (cfg.target_hidden_size or cfg.hidden_size):
        raise WorkbenchError(f"the draft expects target hidden size {cfg.target_hidden_size or cfg.hidden_size}, "
                             f"the target has {target.hidden_size}", hint="pair the draft with its own verifier")
    expected = set(draft.checkpoint_state(include_embeddings="embed_tokens.weight" in state))
    missing = sorted(expected - set(state))
    extra = sorted(set(state) - expected - {"t2d", "verifier_lm_head.weight", "verifier_norm.weight"})
    if missing or extra:
        raise WorkbenchError(f"checkpoint tensors do not match the config: missing {missing[:5]}, unexpected "
                             f"{extra[:5]}", where=str(folder), hint=f"run `python -m engine validate {folder}`")
    if draft.t2d is not None and "t2d" not in state:
        state["t2d"] = vocab_maps(selected_from_d2t(state["d2t"]), cfg.vocab_size)[1]
    own = {k: v for k, v in state.items() if k in expected or k == "t2d"}
    result = draft.load_state_dict(own, strict=False)
    bad = [k for k in result.missing_keys if not k.startswith(("rotary_emb.", "embed_tokens."))]
    if bad:
        raise WorkbenchError(f"tensors not loaded: {bad[:5]}", where=str(folder))
    draft.to(dtype=dtype) if embed is None else module_to_dtype_except(draft, dtype)
    return draft.eval()


def save_eagle3(draft: Eagle3Draft, path: str | os.PathLike, *, dtype: torch.dtype | None = torch.bfloat16,
                include_embeddings: bool = True, extra_files: dict[str, str] | None = None,
                config_updates: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors exactly as vLLM loads them (atomic).

    `embed_tokens` is written by default, as speculators does: speculators 0.9.0 fills a missing one with
    random values (vLLM would share the target's), so a draft without it drafts differently there."""
    cfg = draft.config.to_dict()
    cfg["architectures"] = ["Eagle3DraftModel"]  # what speculators' trainer writes for trained drafts
    cfg.update(config_updates or {})
    return save_checkpoint(path, cfg, draft.checkpoint_state(include_embeddings=include_embeddings), dtype=dtype,
                           extra_files=extra_files)
