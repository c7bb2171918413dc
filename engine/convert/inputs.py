"""Open a source checkpoint for conversion: a folder, one .safetensors, shards with an index, a checked zip, or
(only when allowed) pickled weights read with `torch.load(weights_only=True)`."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from engine.errors import WorkbenchError, translate
from engine.format.checkpoint import TensorInfo, load_state_dict, read_config_dict, tensor_index
from engine.fsutil import atomic_directory, remove_ours
from engine.jobs import runs_dir
from engine.weightfiles import INDEX_NAME, PICKLE_SUFFIXES, weight_files

# Limits on what a zip may expand to, checked from its directory before anything is written (checkpoint
# weights hardly compress, so a high ratio is a zip bomb, not a checkpoint).
MAX_UNZIPPED_BYTES = int(float(os.environ.get("WORKBENCH_MAX_UNZIP_GB", "16")) * 2**30)
MAX_RATIO = 100  # uncompressed bytes per byte of zip, for zips that expand beyond RATIO_FREE_BYTES
RATIO_FREE_BYTES = 64 * 2**20
MAX_MEMBERS = 10_000
STAGED_TTL_S = 6 * 3600  # staged zips unused for this long are removed
STAGED_KEEP = 4  # ... and beyond the newest few, those unused for STAGED_RECENT_S
STAGED_RECENT_S = 15 * 60


@dataclass
class Source:
    """A checkpoint to convert: its folder (config.json) and, when one file was named, only that file."""

    folder: Path
    file: Path | None = None  # a single .safetensors / .bin given explicitly

    @property
    def config(self) -> dict[str, Any]:
        return read_config_dict(self.folder)

    def pickled(self) -> list[Path]:
        if self.file is not None:
            return [self.file] if self.file.suffix in PICKLE_SUFFIXES else []
        try:
            weight_files(self.folder)
            return []
        except WorkbenchError:
            return sorted(f for f in self.folder.iterdir() if f.suffix in PICKLE_SUFFIXES)

    def index(self) -> dict[str, TensorInfo]:
        """Name -> shape/dtype from safetensors headers; pickled weights are not opened (empty)."""
        if self.pickled():
            return {}
        if self.file is None:
            return tensor_index(self.folder)
        return _header_index(self.file)

    def load(self, *, allow_pickle: bool = False) -> dict[str, Any]:
        """All tensors (pickles only with `allow_pickle`, then `weights_only=True`)."""
        pickled = self.pickled()
        if pickled:
            return _load_pickles(pickled, allow_pickle=allow_pickle, where=str(self.folder))
        if self.file is None:
            return load_state_dict(self.folder)
        from safetensors.torch import load_file

        return load_file(str(self.file))


def _header_index(file: Path) -> dict[str, TensorInfo]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            return {n: TensorInfo(n, tuple(handle.get_slice(n).get_shape()), str(handle.get_slice(n).get_dtype()),
                                  file.name) for n in handle.keys()}  # noqa: SIM118
    except Exception as exc:
        raise WorkbenchError(f"cannot read {file.name}: {exc}", where=str(file),
                             hint="the file is corrupt or not safetensors; re-save it") from exc


def _load_pickles(files: list[Path], *, allow_pickle: bool, where: str) -> dict[str, Any]:
    import pickle

    import torch

    if not allow_pickle:
        raise WorkbenchError(
            f"only pickled weights ({', '.join(f.name for f in files)}); they are not read by default because "
            "unpickling can run arbitrary code", where=where,
            hint="re-save them as safetensors, or add --allow-pickle if you trust the file (read with "
            "torch.load(weights_only=True))")
    state: dict[str, Any] = {}
    for f in files:
        try:
            obj = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            refused = translate(exc)  # names the Python object the file holds, without torch's advice text
            raise WorkbenchError(refused.message, where=str(f),
                                 hint="load it once in a trusted Python session and save only its state dict "
                                 "with safetensors.torch.save_file") from exc
        if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict):
            raise WorkbenchError(f"{f.name} does not hold a state dict (a {type(obj).__name__})", where=str(f))
        state.update({k: v for k, v in obj.items() if isinstance(v, torch.Tensor)})
    return state


def open_source(path: str | os.PathLike, *, staging: Path | None = None) -> Source:
    """A folder, config.json, a .safetensors/.bin file, a shard index, or a .zip (extracted under `staging`)."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".zip":
        return Source(checkpoint_root(stage_zip(p, staging or _default_staging())))
    if p.is_file() and (p.suffix == ".safetensors" or p.suffix in PICKLE_SUFFIXES):
        _need_config(p.parent, f"{p.name} has no config.json next to it")
        return Source(p.parent, p)
    if p.is_file() and p.name in ("config.json", INDEX_NAME):
        return Source(p.parent)
    if p.is_dir():
        return Source(checkpoint_root(p))
    raise WorkbenchError(f"{p} is not a checkpoint folder, weights file or .zip", where=str(p),
                         hint="give the folder holding config.json and the weights, one .safetensors file, or a zip")


def _need_config(folder: Path, message: str) -> None:
    if not (folder / "config.json").is_file():
        raise WorkbenchError(message, where=str(folder), hint="put the source's config.json next to its weights")


def checkpoint_root(folder: Path) -> Path:
    """The folder that holds config.json (a zip may wrap the checkpoint in a sub-folder)."""
    if (folder / "config.json").is_file():
        return folder
    found = sorted(folder.rglob("config.json"), key=lambda p: len(p.parts))
    if not found:
        raise WorkbenchError("no config.json found", where=str(folder),
                             hint="a checkpoint needs config.json next to its weights")
    return found[0].parent


# -- zips -------------------------------------------------------------------------------------------------


def safe_member(name: str) -> bool:
    """A zip member path that stays inside the extraction folder (relative, no `..`, no drive letter)."""
    if not name or name.startswith(("/", "\\")):
        return False
    p = PurePosixPath(name.replace("\\", "/"))
    return not p.is_absolute() and ".." not in p.parts and not (p.parts and ":" in p.parts[0])


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_zip(zf: zipfile.ZipFile, *, name: str, size: int | None, dest: Path) -> int:
    """Refuse, before extracting, a zip with unsafe paths or that expands too much; return its unpacked size."""
    infos = zf.infolist()
    bad = [i.filename for i in infos if not safe_member(i.filename)]
    if bad:
        raise WorkbenchError(f"the zip holds unsafe paths {bad[:3]} (absolute or with '..')", where=name,
                             hint="zip the checkpoint folder itself")
    if len(infos) > MAX_MEMBERS:
        raise WorkbenchError(f"the zip holds {len(infos)} entries (at most {MAX_MEMBERS})", where=name,
                             hint="a checkpoint is config.json and a few .safetensors files: zip only those")
    total = sum(i.file_size for i in infos)
    limit = MAX_UNZIPPED_BYTES
    if total > limit:
        raise WorkbenchError(f"the zip expands to {_gib(total)}, more than the {_gib(limit)} limit",
                             where=name, hint="give the checkpoint's local folder path instead, or raise the limit "
                             "with WORKBENCH_MAX_UNZIP_GB in the environment")
    packed = size or sum(i.compress_size for i in infos) or 1
    if total > RATIO_FREE_BYTES and total / packed > MAX_RATIO:
        raise WorkbenchError(f"the zip expands {total / packed:.0f} times ({_gib(packed)} to {_gib(total)}); "
                             f"checkpoints do not compress like that, so it is refused as a zip bomb", where=name,
                             hint="re-create the zip from the checkpoint folder, or give the files themselves")
    dest.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest).free
    if total + 2**30 > free:
        raise WorkbenchError(f"not enough disk space to unpack the zip: it needs {_gib(total)} plus a 1 GiB margin, "
                             f"{_gib(free)} is free", where=str(dest), hint="free disk space there")
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
                             hint="re-create the zip, or give the files") from exc


def _default_staging() -> Path:
    return runs_dir() / "uploads"


def stage_zip(path: Path, root: Path) -> Path:
    """A local zip extracted once under `root` (again when its size or time changes)."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return staged(root, f"convert-{key}", lambda tmp: extract_zip(path, tmp, name=str(path), size=st.st_size))


def staged(root: Path, name: str, write: Callable[[Path], None]) -> Path:
    """root/<name>, written by `write(tmp)` once (atomically, owned by us); later calls only mark it as used."""
    folder = root / name
    if folder.is_dir():
        os.utime(folder)  # used now: not stale
    else:
        with atomic_directory(folder, owner="upload") as tmp:
            write(tmp)
    prune_staged(root, keep=folder)
    return folder


def prune_staged(root: Path, keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove staged sources (and temp folders of interrupted ones) no longer used; only what staging wrote."""
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    found = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith(("convert-", ".convert-"))),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for rank, p in enumerate(p for p in found if not p.name.startswith(".")):
        age = now - p.stat().st_mtime
        if p != keep and (age > STAGED_TTL_S or (rank >= STAGED_KEEP and age > STAGED_RECENT_S)):
            removed.append(p)
    removed += [p for p in found if p.name.startswith(".") and now - p.stat().st_mtime > STAGED_TTL_S]
    return [p for p in removed if remove_ours(p)]
