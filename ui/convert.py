"""Glue for the Convert page: stage uploaded checkpoints, detect their format, show the key mapping, zip results.

Detection reads only config.json and safetensors headers. The conversion itself belongs to the engine
(`python -m engine convert`); until that command exists the page shows what would be done and says so.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import read_config_dict, tensor_index
from engine.jobs import runs_dir

SPECULATORS, EAGLE3_RESEARCH, UNKNOWN = "speculators", "eagle3-research", "unknown"


@dataclass
class Detection:
    folder: str
    format: str
    title: str
    algorithm: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    mapping: list[dict[str, Any]] = field(default_factory=list)


def _safe_member(name: str) -> bool:
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts and not name.startswith(("/", "\\"))


def stage(files: Iterable[tuple[str, bytes]]) -> Path:
    """Write uploaded files (config.json + *.safetensors, or one zip) into runs/uploads/convert-<hash>/."""
    files = list(files)
    if not files:
        raise WorkbenchError("nothing uploaded", hint="drop config.json and the .safetensors files, or a zip")
    digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() + n.encode() for n, d in files)).hexdigest()[:12]
    folder = runs_dir() / "uploads" / f"convert-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files:
        base = Path(name).name
        if base.endswith(".zip"):
            extract_zip(io.BytesIO(data), folder)
        else:
            from engine.fsutil import atomic_write_bytes

            atomic_write_bytes(folder / base, data)
    return checkpoint_root(folder)


def extract_zip(source, folder: Path) -> None:
    try:
        with zipfile.ZipFile(source) as zf:
            bad = [n for n in zf.namelist() if not _safe_member(n)]
            if bad:
                raise WorkbenchError(f"the zip holds unsafe paths {bad[:3]}", hint="zip the checkpoint folder itself")
            zf.extractall(folder)
    except zipfile.BadZipFile as exc:
        raise WorkbenchError(f"not a valid zip file ({exc})", hint="re-create the zip, or upload the files") from exc


def checkpoint_root(folder: Path) -> Path:
    """The folder that holds config.json (a zip may wrap the checkpoint in a sub-folder)."""
    if (folder / "config.json").is_file():
        return folder
    found = sorted(folder.rglob("config.json"), key=lambda p: len(p.parts))
    if not found:
        raise WorkbenchError("no config.json in the upload", hint="a checkpoint needs config.json next to its weights")
    return found[0].parent


def resolve_input(path: str) -> Path:
    """A local checkpoint folder, or a .zip path (extracted under runs/uploads/)."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".zip":
        folder = runs_dir() / "uploads" / f"convert-{hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:12]}"
        folder.mkdir(parents=True, exist_ok=True)
        extract_zip(p, folder)
        return checkpoint_root(folder)
    if p.is_file() and p.name == "config.json":
        return p.parent
    if not p.is_dir():
        raise WorkbenchError(f"{p} is not a folder or a .zip",
                             hint="give the checkpoint folder (config.json + weights)")
    return checkpoint_root(p)


def detect(folder: str | Path) -> Detection:
    folder = Path(folder)
    cfg = read_config_dict(folder)
    index = tensor_index(folder)
    keys = sorted(index)
    if isinstance(cfg.get("speculators_model_type"), str):
        det = Detection(str(folder), SPECULATORS, "speculators format (vLLM serves it as is)",
                        algorithm=cfg["speculators_model_type"])
        det.facts = {"algorithm": det.algorithm,
                     "verifier": ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path"),
                     "speculators_version": cfg.get("speculators_version"), "tensors": len(keys)}
        for k in keys:
            canon = vr.canonical_name(k)
            note = ("vLLM ignores it (speculators needs it to reload a reduced vocabulary)" if canon is None
                    else "renamed by vLLM on load" if canon != k else "")
            det.mapping.append(_row(index[k], canon or "(not loaded by vLLM)", note))
        if any(k.startswith("midlayer.") for k in keys):
            det.notes.append("Uses the older `midlayer.*` names; vLLM and the workbench rename them to `layers.0.*`.")
        return det
    if any(k.startswith("midlayer.") for k in keys):
        det = Detection(str(folder), EAGLE3_RESEARCH, "EAGLE-3 research checkpoint (`midlayer.*` keys)",
                        algorithm="eagle3")
        det.facts = {k: cfg.get(k) for k in ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                                             "vocab_size", "draft_vocab_size", "target_hidden_size") if k in cfg}
        det.facts["tensors"] = len(keys)
        for k in keys:
            if k.startswith("midlayer."):
                det.mapping.append(_row(index[k], "layers.0." + k[len("midlayer."):], "decoder layer 0"))
            elif k == "t2d":
                det.mapping.append(_row(index[k], "t2d", "kept (vLLM ignores it; speculators reloads with it)"))
            elif k == "embed_tokens.weight":
                det.mapping.append(_row(index[k], k, "kept: the draft's own embedding"))
            else:
                det.mapping.append(_row(index[k], k, ""))
        det.notes += [
            "The converted config.json is a speculators `eagle3` config: `transformer_layer_config` from this "
            "config, `speculators_config.verifier` naming the target (hub id), `draft_vocab_size` from `d2t`.",
            "Research checkpoints do not record their aux layer ids: the target's defaults [2, N//2, N-3] apply "
            "unless you know the ones it was trained with.",
        ]
        return det
    det = Detection(str(folder), UNKNOWN, "unknown format")
    det.facts = {"architectures": cfg.get("architectures"), "model_type": cfg.get("model_type"), "tensors": len(keys)}
    det.notes.append("Neither a speculators config (`speculators_model_type`) nor EAGLE-3 research weights "
                     "(`midlayer.*`). Supported: speculators drafts and EAGLE-3 research checkpoints.")
    det.mapping = [_row(index[k], "", "") for k in keys]
    return det


def _row(info, target: str, note: str) -> dict[str, Any]:
    return {"source key": info.name, "shape": str(list(info.shape)), "dtype": info.dtype, "speculators key": target,
            "note": note}


def engine_convert_command() -> bool:
    """Whether the engine has a `convert` CLI command yet."""
    from engine.cli import COMMANDS

    return "convert" in COMMANDS


def convert_argv(src: str, out: str, verifier: str | None, aux_layer_ids: str | None,
                 overwrite: bool = False) -> list[str]:
    argv = ["convert", src, "--out", out]
    if overwrite:
        argv.append("--overwrite")
    if verifier:
        argv += ["--target", verifier]
    if aux_layer_ids:
        argv += ["--aux-layer-ids", aux_layer_ids]
    return argv


def default_out(src: str | Path) -> str:
    return str(runs_dir() / "converted" / Path(src).name)


def zip_folder(folder: str | Path) -> bytes:
    """The checkpoint folder as a zip (files at the top level, lock files skipped)."""
    folder = Path(folder)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in sorted(folder.rglob("*")):
            if f.is_file() and not f.name.startswith(".workbench"):
                zf.write(f, f.relative_to(folder).as_posix())
    return buf.getvalue()
