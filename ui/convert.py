"""Glue for the Convert page: stage uploaded checkpoints, detect their format, show the key mapping, zip results.

Detection reads only config.json and safetensors headers and asks the engine's converters
(`engine.convert.detect`); the conversion itself is `python -m engine convert` as a job.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import read_config_dict, tensor_index
from engine.jobs import runs_dir

SPECULATORS, UNKNOWN = "speculators", "unknown"  # engine.convert.detect's two formats besides its converters


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


# Limits on what an uploaded or given zip may expand to, checked from its directory before anything is written
# (checkpoint weights hardly compress, so a high ratio is a zip bomb, not a checkpoint).
MAX_UNZIPPED_BYTES = int(float(os.environ.get("WORKBENCH_MAX_UNZIP_GB", "16")) * 2**30)
MAX_RATIO = 100  # uncompressed bytes per byte of zip, for zips that expand beyond RATIO_FREE_BYTES
RATIO_FREE_BYTES = 64 * 2**20
MAX_MEMBERS = 10_000
STAGED_TTL_S = 6 * 3600  # staged uploads unused for this long are removed
STAGED_KEEP = 4  # ... and beyond the newest few, those unused for STAGED_RECENT_S
STAGED_RECENT_S = 15 * 60


def uploads_dir() -> Path:
    return runs_dir() / "uploads"


def stage(files: Iterable[tuple[str, bytes]]) -> Path:
    """Write uploaded files (config.json + *.safetensors, or one zip) into runs/uploads/convert-<hash>/.

    Keyed by the content hash: the same upload is written (and its zip extracted) once, on the first run
    of the page, and reused on every rerun. The folder appears complete or not at all; stale staged
    uploads are removed.
    """
    files = list(files)
    if not files:
        raise WorkbenchError("nothing uploaded", hint="drop config.json and the .safetensors files, or a zip")
    digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() + n.encode() for n, d in files)).hexdigest()[:12]

    def write(tmp: Path) -> None:
        for name, data in files:
            base = Path(name).name
            if base.endswith(".zip"):
                extract_zip(io.BytesIO(data), tmp, name=base, size=len(data))
            else:
                from engine.fsutil import atomic_write_bytes

                atomic_write_bytes(tmp / base, data)

    return checkpoint_root(_staged(f"convert-{digest}", write))


def _staged(name: str, write) -> Path:
    """runs/uploads/<name>, written by `write(tmp)` once (atomically); later calls only mark it as used."""
    from engine.fsutil import atomic_directory

    folder = uploads_dir() / name
    if folder.is_dir():
        os.utime(folder)  # used now: not stale
    else:
        with atomic_directory(folder, owner="upload") as tmp:
            write(tmp)
    prune_staged(keep=folder)
    return folder


def still_staged(folder: str | Path) -> bool:
    """Whether a staged upload is still on disk (marking it as used)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return False
    for p in (folder, *folder.parents):
        if p.parent == uploads_dir():
            os.utime(p)
            break
    return True


def prune_staged(keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove staged uploads (and temp folders of interrupted ones) that are no longer used; return them."""
    root = uploads_dir()
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    staged = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(("convert-", ".convert-"))),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for rank, p in enumerate(p for p in staged if not p.name.startswith(".")):
        age = now - p.stat().st_mtime
        if p != keep and (age > STAGED_TTL_S or (rank >= STAGED_KEEP and age > STAGED_RECENT_S)):
            removed.append(p)
    removed += [p for p in staged if p.name.startswith(".") and now - p.stat().st_mtime > STAGED_TTL_S]
    from engine.fsutil import remove_ours

    removed = [p for p in removed if remove_ours(p)]  # only what the staging itself wrote
    return removed


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_zip(zf: zipfile.ZipFile, *, name: str, size: int | None, dest: Path) -> int:
    """Refuse, before extracting, a zip with unsafe paths or that expands too much; return its unpacked size."""
    infos = zf.infolist()
    bad = [i.filename for i in infos if not _safe_member(i.filename)]
    if bad:
        raise WorkbenchError(f"the zip holds unsafe paths {bad[:3]}", where=name, hint="zip the checkpoint folder itself")
    if len(infos) > MAX_MEMBERS:
        raise WorkbenchError(f"the zip holds {len(infos)} entries (at most {MAX_MEMBERS})", where=name,
                             hint="a checkpoint is config.json and a few .safetensors files: zip only those")
    total = sum(i.file_size for i in infos)
    if total > MAX_UNZIPPED_BYTES:
        raise WorkbenchError(f"the zip expands to {_gib(total)}, more than the {_gib(MAX_UNZIPPED_BYTES)} limit",
                             where=name, hint="give the checkpoint's local folder path instead, or raise the limit "
                             "with WORKBENCH_MAX_UNZIP_GB in the environment of the app")
    packed = size or sum(i.compress_size for i in infos) or 1
    if total > RATIO_FREE_BYTES and total / packed > MAX_RATIO:
        raise WorkbenchError(f"the zip expands {total / packed:.0f} times ({_gib(packed)} to {_gib(total)}); "
                             f"checkpoints do not compress like that, so it is refused as a zip bomb", where=name,
                             hint="re-create the zip from the checkpoint folder, or upload the files themselves")
    free = shutil.disk_usage(dest).free
    if total + 2**30 > free:
        raise WorkbenchError(f"not enough disk space to unpack the zip: it needs {_gib(total)} plus a 1 GiB margin, "
                             f"{_gib(free)} is free", where=str(dest), hint="free disk space under runs/uploads/")
    return total


def extract_zip(source, folder: Path, *, name: str = "the zip", size: int | None = None) -> None:
    """Extract a checked zip (see `check_zip`) into `folder`, never writing more than its directory declares."""
    try:
        with zipfile.ZipFile(source) as zf:
            budget = check_zip(zf, name=name, size=size, dest=folder)
            for info in zf.infolist():
                target = folder / info.filename
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        budget -= len(chunk)
                        if budget < 0:
                            raise WorkbenchError("the zip holds more data than its directory declares", where=name,
                                                 hint="re-create the zip from the checkpoint folder")
                        dst.write(chunk)
    except zipfile.BadZipFile as exc:
        raise WorkbenchError(f"not a valid zip file ({exc})", where=name,
                             hint="re-create the zip, or upload the files") from exc


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
        st = p.stat()  # a changed zip (size or time) is extracted again, an unchanged one once
        key = hashlib.sha256(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
        return checkpoint_root(_staged(f"convert-{key}", lambda tmp: extract_zip(p, tmp, name=str(p),
                                                                                size=st.st_size)))
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
    from engine.convert import CONVERTERS, mapping_table
    from engine.convert import detect as detect_source

    found = detect_source(folder)
    if found.format in CONVERTERS:
        converter = CONVERTERS.get(found.format)()
        det = Detection(str(folder), found.format, found.description, algorithm=converter.algorithm or None)
        det.facts = {k: cfg.get(k) for k in ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                                             "vocab_size", "draft_vocab_size", "target_hidden_size") if k in cfg}
        det.facts["tensors"] = len(keys)
        for source, target in mapping_table(folder, found.format):
            note = "dropped (not part of the speculators draft)" if target is None else \
                "renamed" if target != source else ""
            det.mapping.append(_row(index[source], target or "(dropped)", note))
        det.notes += list(converter.notes)
        return det
    det = Detection(str(folder), UNKNOWN, "unknown format")
    det.facts = {"architectures": cfg.get("architectures"), "model_type": cfg.get("model_type"), "tensors": len(keys)}
    det.notes.append("Neither a speculators config (`speculators_model_type`) nor a research layout the converters "
                     "know. Supported: speculators drafts and " + "; ".join(
                         CONVERTERS.get(n).description for n in CONVERTERS.names()) + ".")
    det.mapping = [_row(index[k], "", "") for k in keys]
    return det


def convertible(det: Detection) -> bool:
    """A research layout one of the engine's converters handles."""
    return det.format not in (SPECULATORS, UNKNOWN)


def _row(info, target: str, note: str) -> dict[str, Any]:
    return {"source key": info.name, "shape": str(list(info.shape)), "dtype": info.dtype, "speculators key": target,
            "note": note}


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


def converts(job, src: str | Path) -> bool:
    """Whether a convert job's source (its first argument) is the checkpoint folder `src`."""
    argv = list(job.argv)
    source = argv[argv.index("convert") + 1] if "convert" in argv[:-1] else None
    return source is not None and Path(source).resolve() == Path(src).resolve()


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
