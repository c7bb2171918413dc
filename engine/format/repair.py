"""Repair what `validate` finds fixable in a draft folder: store the verifier's embedding where speculators needs it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import WorkbenchError
from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint, tensor_index
from engine.format.config import CONFIG_TYPES, config_type
from engine.fsutil import atomic_save_safetensors, claim_names, is_ours
from engine.weightfiles import INDEX_NAME, WEIGHTS_NAME

EMBED = "embed_tokens.weight"


@dataclass(frozen=True)
class EmbeddingNeed:
    """Whether a draft lacks the embedding its format needs stored, and the shape that embedding must have."""

    missing: bool
    shape: tuple[int, int]  # [vocab, hidden]
    reason: str


def embedding_need(folder: str | os.PathLike) -> EmbeddingNeed:
    """Does this draft need `embed_tokens.weight` stored (speculators 0.9.0 fills a missing one with random
    values for types that store it), and of which shape."""
    cfg = read_config_dict(folder)
    kind = cfg.get("speculators_model_type")
    layer = cfg.get("transformer_layer_config") or {}
    shape = (int(layer.get("vocab_size", 0)), int(layer.get("hidden_size", 0)))
    config_type(kind)  # a clear error for a type the workbench does not know (engine.algos registers them)
    names = tensor_index(folder)
    if lacks_stored_embedding(cfg, names):
        return EmbeddingNeed(True, shape, "absent: speculators 0.9.0 would fill it with random values")
    if EMBED in names:
        return EmbeddingNeed(False, shape, "the draft already stores embed_tokens")
    return EmbeddingNeed(False, shape, f"{kind} drafts share the verifier's embedding in both vLLM and "
                         "speculators: nothing to store")


def lacks_stored_embedding(cfg: dict, tensor_names) -> bool:
    """The rule `validate` warns by and `repair` mends: a draft of a type whose embedding speculators 0.9.0 loads
    from the checkpoint (a missing one is filled with random values) that does not store it (vLLM shares the
    verifier's, so only speculators drafts differently). False for an unknown type."""
    kind = cfg.get("speculators_model_type")
    known = isinstance(kind, str) and kind in CONFIG_TYPES
    return bool(known and CONFIG_TYPES.get(kind).stores_embeddings and EMBED not in tensor_names)


def _floating_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype the draft's weights are stored in (its floating tensors agree in a workbench draft)."""
    dtypes = [t.dtype for t in state.values() if t.is_floating_point()]
    return max(set(dtypes), key=dtypes.count) if dtypes else torch.float32


def add_embeddings(folder: str | os.PathLike, embedding: torch.Tensor, *, out: str | os.PathLike | None = None,
                   overwrite: bool = False) -> Path:
    """Write the draft with `embedding` ([vocab, hidden], the verifier's) stored as embed_tokens.weight.

    In place only for a single-file draft the workbench wrote (its owner marker records model.safetensors);
    otherwise `out` gets a new draft folder (config.json + weights) and the source is left as it was.
    Returns the folder written.
    """
    folder = Path(folder)
    need = embedding_need(folder)
    if not need.missing:
        raise WorkbenchError(f"nothing to repair: {need.reason}", where=str(folder))
    if tuple(embedding.shape) != need.shape:
        raise WorkbenchError(
            f"the verifier's embedding is {list(embedding.shape)}, but the draft needs [vocab_size, hidden_size] = "
            f"{list(need.shape)}", where=str(folder),
            hint="give --target the verifier this draft was trained for (its config's speculators_config.verifier)")
    state = load_state_dict(folder)  # safetensors only: no unpickling
    dtype = _floating_dtype(state)
    state[EMBED] = embedding.detach().to(dtype).cpu().contiguous()  # [V, H]
    if out is not None:
        return save_checkpoint(out, read_config_dict(folder), state, overwrite=overwrite)
    single = (folder / WEIGHTS_NAME).is_file() and not (folder / INDEX_NAME).exists()
    if not (single and is_ours(folder)):
        raise WorkbenchError(
            "this draft folder was not written by the workbench (or is sharded), so it is not rewritten in place",
            where=str(folder), hint="give --out a new folder for the repaired draft (the source stays as it is)")
    claim_names(folder, [WEIGHTS_NAME], kind="draft")
    atomic_save_safetensors(state, folder / WEIGHTS_NAME, metadata={"format": "pt"})
    return folder
