"""vLLM's own form of a Gemma 4 layout DSpark draft: the folder through which vLLM reaches Gemma4DSparkModel."""

# vLLM's speculators-format detection maps every dspark draft to Qwen3DSparkModel, so this layout is served from a
# folder whose config.json is a Gemma 4 text config with architectures ["Gemma4DSparkModel"] and the DSpark fields,
# loaded with the explicit --speculative-config '{"method": "dspark", "model": FOLDER}'. This module imports no torch.

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engine.algos.dflash.config import vllm_target_layer_ids
from engine.errors import WorkbenchError
from engine.fsutil import atomic_directory, atomic_write_text

GEMMA4_LAYOUT = "gemma4_text"  # transformer_layer_config.model_type of drafts in Gemma4DSparkModel's layout
GEMMA4_ARCHITECTURE = "Gemma4DSparkModel"


def is_gemma4_layout(layer_config: dict[str, Any] | None) -> bool:
    """Whether a draft's `transformer_layer_config` is in the layout of vLLM's Gemma4DSparkModel."""
    return bool(layer_config) and layer_config.get("model_type") == GEMMA4_LAYOUT


ACTIVATION = "gelu_pytorch_tanh"


def layout_problems(tlc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """What in a Gemma 4 layout's layer config cannot run: (field, why, whether vLLM refuses it too; else only the
    workbench's in-process model cannot compute it)."""
    problems = []
    if any(t != "full_attention" for t in tlc.get("layer_types") or []) or not tlc.get("attention_k_eq_v"):
        problems.append(("transformer_layer_config.layer_types", "a Gemma 4 DSpark draft needs every layer full "
                         "attention with attention_k_eq_v: vLLM's Gemma4DSparkModel computes the context keys and "
                         "values that way only (its loader asserts it)", True))
    if tlc.get("hidden_activation", ACTIVATION) != ACTIVATION:
        problems.append(("transformer_layer_config.hidden_activation", f"'{tlc.get('hidden_activation')}': the "
                         f"workbench's Gemma 4 layout runs {ACTIVATION} only", False))
    rope = (tlc.get("rope_parameters") or {}).get("full_attention") or {}
    if rope.get("rope_type", "default") != "default":
        problems.append(("transformer_layer_config.rope_parameters", f"RoPE type '{rope.get('rope_type')}' of the "
                         "full-attention layers: the workbench's Gemma 4 layout runs the default RoPE only", False))
    return problems


def vllm_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config.json of vLLM's form from our speculators config: the Gemma 4 text config, the DSpark fields and
    `target_layer_ids` (vLLM's ids: ours minus one)."""
    tlc = dict(cfg["transformer_layer_config"])
    out = {**tlc, "architectures": [GEMMA4_ARCHITECTURE],
           "target_layer_ids": vllm_target_layer_ids(cfg["aux_hidden_state_layer_ids"]),
           "target_hidden_size": cfg.get("target_hidden_size") or tlc["hidden_size"],
           "dspark_bonus_anchor": not cfg.get("sample_from_anchor", True)}
    for key in ("block_size", "mask_token_id", "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "sample_from_anchor"):
        if cfg.get(key) is not None:
            out[key] = cfg[key]
    return out


def write_vllm_folder(draft: str | os.PathLike, out: str | os.PathLike, cfg: dict[str, Any] | None = None) -> Path:
    """Write vLLM's form of a Gemma 4 layout draft to `out` (atomic): its config.json, and links to the draft's
    weight files (the tensors and their names are the same; a Gemma 4 head and embedding are not copied). `cfg`: the
    draft's config.json when the caller has read it."""
    from engine.format.checkpoint import CONFIG_NAME, read_config_dict

    folder = Path(draft)
    cfg = cfg if cfg is not None else read_config_dict(folder)
    if not is_gemma4_layout(cfg.get("transformer_layer_config")):
        raise WorkbenchError(f"{folder} is not a Gemma 4 layout DSpark draft", where=str(folder / CONFIG_NAME))
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.safetensors.index.json"))
    with atomic_directory(out, owner="vllm-form") as tmp:
        atomic_write_text(tmp / CONFIG_NAME, json.dumps(vllm_config(cfg), indent=2, sort_keys=True) + "\n")
        for f in weights:
            (tmp / f.name).symlink_to(f.resolve())
    return Path(out)
