"""Read and write draft checkpoints (config.json + model.safetensors, sharded or not) without unpickling."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import WorkbenchError
from engine.format.config import parse_draft_config
from engine.fsutil import (
    atomic_directory,
    atomic_save_safetensors,
    atomic_write_json,
    atomic_write_text,
    check_replaceable,
)
from engine.weightfiles import INDEX_NAME, WEIGHTS_NAME, pickle_files, weight_files

CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class TensorInfo:
    """What a safetensors header says about one tensor (read without loading the data)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    file: str


def config_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / CONFIG_NAME if p.is_dir() else p


def read_config_dict(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of a draft folder (or a lone config file) as a dict, with clear errors."""
    p = config_path(path)
    if not p.exists():
        raise WorkbenchError(f"no config.json at {p}", hint="give a draft folder or the path of its config.json")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise WorkbenchError(f"config.json is not valid UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start})", where=str(p), hint="re-save it as UTF-8 JSON") from exc
    except RecursionError as exc:
        raise WorkbenchError("config.json is nested too deeply to read", where=str(p)) from exc
    except json.JSONDecodeError as exc:
        raise WorkbenchError(
            f"config.json is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", where=str(p),
            hint="fix the JSON syntax at that position",
        ) from exc
    if not isinstance(data, dict):
        raise WorkbenchError("config.json must hold a JSON object", where=str(p))
    return data


def weights_sha256(folder: str | os.PathLike) -> str:
    """sha256 over the bytes of a checkpoint's safetensors files in name order: which weights a record measured
    (a re-shipped draft keeps its folder name, so the name alone cannot tell)."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(weight_files(folder), key=lambda p: p.name):
        with open(f, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()


def tensor_index(folder: str | os.PathLike) -> dict[str, TensorInfo]:
    """Name -> shape/dtype for every tensor, reading only safetensors headers."""
    from safetensors import safe_open

    out: dict[str, TensorInfo] = {}
    for f in weight_files(folder):
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    sl = handle.get_slice(name)
                    out[name] = TensorInfo(name, tuple(sl.get_shape()), str(sl.get_dtype()), f.name)
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types for corrupt files
            raise WorkbenchError(f"cannot read {f.name}: {exc}", where=str(folder),
                                 hint="the file is corrupt or not safetensors; re-save it") from exc
    return out


def load_state_dict(
    folder: str | os.PathLike, *, allow_pickle: bool = False, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint. Pickled files only with `allow_pickle`, and then `weights_only=True`."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        files = weight_files(folder)
    except WorkbenchError:
        if not allow_pickle or not pickle_files(folder):
            raise
        state: dict[str, torch.Tensor] = {}
        for f in pickle_files(folder):
            obj = torch.load(f, map_location=device, weights_only=True)
            if not isinstance(obj, Mapping):
                raise WorkbenchError(f"{f.name} does not hold a state dict", where=str(folder)) from None
            state.update({k: v for k, v in obj.items() if isinstance(v, torch.Tensor)})
        return state
    state = {}
    for f in files:
        state.update(load_file(str(f), device=device))
    return state


def save_checkpoint(
    folder: str | os.PathLike,
    config: Any,
    state_dict: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
    extra_files: Mapping[str, str] | None = None,
    max_shard_bytes: int | None = None,
    own_shards: Collection[str] = (),
    overwrite: bool = False,
) -> Path:
    """Write config.json + model.safetensors (or shards with an index) atomically."""
    # Floating tensors are cast to `dtype` when given; integer/bool tensors (d2t, t2d) keep theirs. Each tensor
    # named in `own_shards` gets a shard of its own: a tensor that never changes (the verifier's embedding) is then
    # the same file, byte for byte, in every draft saved so, and git stores it once.
    # The folder appears complete or not at all. An existing folder is replaced only when it is empty or a
    # draft the workbench wrote (its ownership marker lists every file in it), or with `overwrite`;
    # otherwise a WorkbenchError says so and nothing is touched.
    check_replaceable(folder, overwrite=overwrite, also_ours=legacy_job_draft)  # before any work
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if dtype is not None:
        cfg["dtype"] = str(dtype).replace("torch.", "")
        cfg.pop("torch_dtype", None)
    tensors = {
        k: (v.detach().to(dtype) if dtype is not None and v.is_floating_point() else v.detach()).cpu().contiguous()
        for k, v in state_dict.items()
    }
    with atomic_directory(folder, owner="draft", overwrite=overwrite, also_ours=legacy_job_draft) as tmp:
        atomic_write_text(tmp / CONFIG_NAME, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        shards = _shard(tensors, max_shard_bytes, own_shards)
        if len(shards) == 1:
            atomic_save_safetensors(shards[0], tmp / WEIGHTS_NAME, metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                atomic_save_safetensors(shard, tmp / name, metadata={"format": "pt"})
                weight_map.update({k: name for k in shard})
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            atomic_write_json(tmp / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
        for name, text in (extra_files or {}).items():
            atomic_write_text(tmp / name, text)
    return Path(folder)


def legacy_job_draft(folder: str | os.PathLike) -> bool:
    """A draft written before ownership markers existed, inside a job folder of ours (`train --out`'s `draft/`).

    Only the files a draft consists of, and the parent folder carries the lock file of a workbench job.
    """
    folder = Path(folder)
    if not (folder.parent / ".workbench.lock").is_file():
        return False
    names = {p.name for p in folder.iterdir()}
    draft_files = {CONFIG_NAME, INDEX_NAME, ".workbench.lock"}
    return CONFIG_NAME in names and all(n in draft_files or n.endswith(".safetensors") for n in names)


def _shard(tensors: dict[str, torch.Tensor], max_bytes: int | None,
           own_shards: Collection[str] = ()) -> list[dict[str, torch.Tensor]]:
    """The tensors in `own_shards` one per shard first, then the rest in shards of at most `max_bytes` (one
    shard without a limit)."""
    shards: list[dict[str, torch.Tensor]] = [{k: tensors[k]} for k in own_shards if k in tensors] + [{}]
    size = 0
    for k, v in tensors.items():
        if k in own_shards:
            continue
        n = v.numel() * v.element_size()
        if max_bytes and shards[-1] and size + n > max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += n
    return [s for s in shards if s] or [{}]


def write_speculative_tokens(folder: str | os.PathLike, k: int) -> Path:
    """Set `speculators_config.proposal_methods[0].speculative_tokens` (vLLM's default k) in a draft's config.json."""
    path = config_path(folder)
    cfg = read_config_dict(folder)
    try:
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = int(k)
        typed = parse_draft_config(cfg)
    except (KeyError, IndexError, TypeError) as exc:
        raise WorkbenchError(f"{path} has no speculators_config.proposal_methods[0]", where=str(path),
                             hint="validate the draft first") from exc
    limit = typed.max_speculative_tokens()
    if k < 1 or (limit is not None and k > limit):
        raise WorkbenchError(f"k = {k} is outside 1..{limit or 'any'} for this draft", where=str(path))
    atomic_write_text(path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return path
