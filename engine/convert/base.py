"""The converter contract: detect a source format, map its tensor names, write a validated speculators draft."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import WorkbenchError
from engine.format.checkpoint import PICKLE_SUFFIXES, read_config_dict
from engine.registry import Registry


class Converter:
    """One source format. Subclasses implement `matches`, `rename` and `build_config` (and may reshape tensors)."""

    name = ""
    description = ""
    algorithm = ""  # the speculators_model_type it writes
    notes: tuple[str, ...] = ()  # what the user should know before converting (shown by the Convert page)

    def matches(self, config: dict[str, Any], names: list[str]) -> bool:
        raise NotImplementedError

    def rename(self, name: str) -> str | None:
        """Target tensor name for a source name (None = dropped)."""
        return name

    def transform(self, state: dict[str, torch.Tensor], config: dict[str, Any], **options: Any) -> dict[str, torch.Tensor]:
        return {new: t for k, t in state.items() if (new := self.rename(k)) is not None}

    def build_config(self, config: dict[str, Any], state: dict[str, torch.Tensor], *, verifier: str | None,
                     verifier_config: dict[str, Any] | None, **options: Any) -> dict[str, Any]:
        raise NotImplementedError


CONVERTERS: Registry[type[Converter]] = Registry("converter")


@dataclass
class Detection:
    format: str  # a converter name, "speculators", or "unknown"
    description: str
    tensor_names: list[str]


def source_names(folder: str | os.PathLike) -> list[str]:
    """Tensor names of a checkpoint folder without loading data (safetensors headers; pickles are not opened)."""
    from engine.format.checkpoint import tensor_index

    folder = Path(folder)
    try:
        return sorted(tensor_index(folder))
    except WorkbenchError:
        if any(f.suffix in PICKLE_SUFFIXES for f in folder.iterdir()):
            return []  # names unknown until the user allows unpickling
        raise


def detect(folder: str | os.PathLike) -> Detection:
    config = read_config_dict(folder)
    names = source_names(folder)
    if "speculators_model_type" in config:
        return Detection("speculators", f"already in the speculators format ({config['speculators_model_type']})",
                         names)
    for name in CONVERTERS.names():
        conv = CONVERTERS.get(name)()
        if conv.matches(config, names):
            return Detection(name, conv.description, names)
    return Detection("unknown", "no converter recognises this checkpoint", names)


def mapping_table(folder: str | os.PathLike, fmt: str | None = None) -> list[tuple[str, str | None]]:
    """(source name, target name or None if dropped) for every tensor of the checkpoint."""
    det = detect(folder)
    fmt = fmt or det.format
    if fmt in ("speculators", "unknown"):
        return [(n, n) for n in det.tensor_names]
    conv = CONVERTERS.get(fmt)()
    return [(n, conv.rename(n)) for n in det.tensor_names]


def convert(src: str | os.PathLike, out: str | os.PathLike, *, fmt: str | None = None, verifier: str | None = None,
            allow_pickle: bool = False, dtype: torch.dtype | None = None, overwrite: bool = False,
            **options: Any) -> Path:
    """Convert `src` into a speculators draft at `out` (atomic) and return it.

    An existing non-empty `out` that is not a draft the workbench wrote is refused unless `overwrite`.
    """
    from engine.format.checkpoint import legacy_job_draft, load_state_dict, save_checkpoint
    from engine.fsutil import check_replaceable

    check_replaceable(out, overwrite=overwrite, also_ours=legacy_job_draft)  # refuse before reading anything

    det = detect(src)
    fmt = fmt or det.format
    if fmt == "speculators":
        raise WorkbenchError("the checkpoint is already in the speculators format", hint="validate it instead")
    if fmt == "unknown":
        raise WorkbenchError("unrecognised source checkpoint", where=str(src),
                             hint=f"known formats: {CONVERTERS.names()}")
    conv = CONVERTERS.get(fmt)()
    config = read_config_dict(src)
    state = load_state_dict(src, allow_pickle=allow_pickle)
    verifier_config = _verifier_config(verifier)
    new_state = conv.transform(state, config, verifier_config=verifier_config, **options)
    new_config = conv.build_config(config, new_state, verifier=verifier, verifier_config=verifier_config, **options)
    return save_checkpoint(out, new_config, new_state, dtype=dtype, overwrite=overwrite)


def _verifier_config(verifier: str | None) -> dict[str, Any] | None:
    if not verifier:
        return None
    from engine.format.validate import _find_verifier_config

    return _find_verifier_config({"speculators_config": {"verifier": {"name_or_path": verifier}}})
