"""The layout llama.cpp's converter reads for the DFlash family: z-lab's `DFlashDraftModel` / `DFlash2DraftModel`.

llama.cpp 0.3.36 converts z-lab's layout, not `DFlashSpeculator`. The tensors keep their names; the config becomes
the flat Qwen3 layer config with `dflash_config` (z-lab's target layer ids: vLLM's minus one) and `is_causal`.
The weight files are linked, not copied. This module imports no torch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from engine.fsutil import atomic_directory, atomic_write_json

QWEN3 = "qwen3"  # llama.cpp's DFlash graph is Qwen3's decoder layer (q/k norms)


def form_problem(cfg: dict[str, Any]) -> str | None:
    """What in a DFlash-family config llama.cpp's DFlash graph cannot run (None: nothing)."""
    tlc = cfg.get("transformer_layer_config") or {}
    if cfg.get("sample_from_anchor"):
        return ("its block predicts from every slot (sample_from_anchor=true), while llama.cpp's DFlash puts the "
                "anchor in slot 0 and drafts block_size - 1 tokens")
    if tlc.get("model_type", QWEN3) != QWEN3:
        return f"its layers are '{tlc.get('model_type')}', and llama.cpp's DFlash graph runs Qwen3 layers only"
    vocab = tlc.get("vocab_size")
    if cfg.get("draft_vocab_size") not in (None, vocab):
        return (f"its vocabulary is reduced ({cfg.get('draft_vocab_size')} of {vocab}), and llama.cpp's DFlash reads "
                "no d2t table")
    return None


def zlab_config(cfg: dict[str, Any], architecture: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """z-lab's config.json for a DFlash-family speculators config."""
    tlc = dict(cfg["transformer_layer_config"])
    dflash = {"mask_token_id": cfg["mask_token_id"], "block_size": cfg["block_size"],
              "target_layer_ids": [i - 1 for i in cfg["aux_hidden_state_layer_ids"]], **(extra or {})}
    return {**tlc, "architectures": [architecture], "model_type": QWEN3, "block_size": cfg["block_size"],
            "dflash_config": dflash, "is_causal": not cfg.get("sliding_window_non_causal", False),
            "torch_dtype": cfg.get("dtype") or tlc.get("torch_dtype") or "bfloat16"}


def write_zlab_form(config: dict[str, Any], draft: Path, out: Path) -> Path:
    """`config` as config.json beside links to the draft's weight files, in `out` (atomic)."""
    with atomic_directory(out, overwrite=True) as tmp:
        atomic_write_json(tmp / "config.json", config)
        for f in sorted(Path(draft).iterdir()):
            if f.suffix == ".safetensors" or f.name == "model.safetensors.index.json":
                _link(f.resolve(), tmp / f.name)
    return out


def _link(src: Path, dst: Path) -> None:
    try:
        os.symlink(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
