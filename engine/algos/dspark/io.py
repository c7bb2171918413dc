"""Build a fresh DSpark draft for a target, and load/save DSpark checkpoints in the speculators layout (through
DFlash's builder and loader, which serve the whole DFlash family)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from engine.algos.dflash.io import FamilyMember, build_dflash, load_dflash, save_dflash
from engine.algos.dspark.args import DSparkArgs, resolved_layout
from engine.algos.dspark.gemma4 import Gemma4DSparkDraft, gemma4_layer_config
from engine.algos.dspark.model import DSparkDraft
from engine.algos.dspark.vllm_form import is_gemma4_layout
from engine.errors import WorkbenchError
from engine.format.checkpoint import read_config_dict


def build_dspark(target, args: DSparkArgs | None = None, **backbone: Any) -> DSparkDraft:
    """A new DSpark draft: DFlash's backbone (`backbone`: aux_layer_ids, token_counts, seed) with every slot
    predicting, plus the Markov and confidence heads `args` shape; in Gemma 4 layers when the layout says so."""
    a = args or DSparkArgs()
    if a.confidence_head_with_markov and a.enable_confidence_head and a.markov_rank <= 0:
        raise WorkbenchError("confidence_head_with_markov needs a Markov head (markov_rank > 0)",
                             hint="set --markov-rank to a positive rank or --no-confidence-head-with-markov")
    fields = {"sample_from_anchor": True, "markov_rank": a.markov_rank, "markov_head_type": a.markov_head_type,
              "enable_confidence_head": a.enable_confidence_head,
              "confidence_head_with_markov": a.confidence_head_with_markov}
    member = FamilyMember("dspark", DSparkDraft, fields)
    if resolved_layout(a, getattr(target.text_config, "model_type", None), target.vocab_size) == "gemma4":
        if a.draft_vocab_size not in (None, target.vocab_size):
            raise WorkbenchError("a Gemma 4 DSpark draft drafts over the full vocabulary: vLLM's "
                                 "Gemma4DSparkForCausalLM has no draft-to-target map",
                                 hint="leave --draft-vocab-size unset, or pass --draft-layout qwen3")
        if a.sliding_window:
            raise WorkbenchError("a Gemma 4 DSpark draft has full-attention layers only (vLLM's Gemma4DSparkModel)",
                                 hint="leave --sliding-window unset, or pass --draft-layout qwen3")
        member = FamilyMember("dspark", Gemma4DSparkDraft, fields,
                              layer_config=gemma4_layer_config(target.text_config, a.num_layers))
    draft = build_dflash(target, a, member=member, **backbone)
    if draft.markov_head is not None:  # speculators' start: a small previous-token embedding, a near-zero bias
        with torch.no_grad():
            draft.markov_head.markov_w1.weight.normal_(0.0, 0.01)
    return draft


def load_dspark(path: str | os.PathLike, target, *, allow_pickle: bool = False,
                dtype: torch.dtype = torch.float32) -> DSparkDraft:
    layers = read_config_dict(Path(path)).get("transformer_layer_config")
    return load_dflash(path, target, allow_pickle=allow_pickle, dtype=dtype, algorithm="dspark",
                       draft_class=Gemma4DSparkDraft if is_gemma4_layout(layers) else DSparkDraft)


def save_dspark(draft: DSparkDraft, path: str | os.PathLike, *, dtype: torch.dtype | None = torch.bfloat16,
                config_updates: dict[str, Any] | None = None) -> Path:
    """config.json (with the fitted confidence temperatures) + model.safetensors, as vLLM loads them (atomic)."""
    return save_dflash(draft, path, dtype=dtype, config_updates=config_updates)
