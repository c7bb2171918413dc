"""Atomic file and directory writes, so that a crash never leaves a half-written artifact."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError

log = logging.getLogger(__name__)

# mkstemp/mkdtemp (and safetensors' own writer) create private (0600/0700) entries; the final files get the
# usual umask-based modes.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE, DIR_MODE = 0o666 & ~_UMASK, 0o777 & ~_UMASK  # as the umask was at import


def current_umask() -> int:
    """The process umask now (read from /proc, since setting it to read it back is not thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK


def file_mode() -> int:
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    return 0o777 & ~current_umask()


def workbench_home() -> Path:
    """Root of caches and default outputs: $WORKBENCH_HOME or ~/.cache/speculators-workbench."""
    return Path(os.environ.get("WORKBENCH_HOME", Path.home() / ".cache" / "speculators-workbench"))


def _publish(tmp: str | Path, path: Path) -> None:
    """Give a written temp file the umask's mode and rename it over `path`."""
    os.chmod(tmp, file_mode())
    os.replace(tmp, path)


def _discard(tmp: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temp file in the same folder and `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, *, sort_keys: bool = False) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n")


def atomic_save_safetensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """`safetensors.torch.save_file` into a temp file, then rename."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        _publish(tmp, path)  # safetensors writes 0600 whatever the umask: a vLLM of another user must read it
    except BaseException:
        _discard(tmp)
        raise
    return path


# A folder written through `atomic_directory(..., owner=...)` lists what it holds in this file, so that a later
# write may replace it without the risk of deleting anything a user put there (or a folder that is not ours).
OWNER_MARKER = ".workbench-owned.json"
PARTIAL_MARKER = ".workbench-partial"  # in every temp folder of `atomic_directory` while it is being written
_INTERNAL = (OWNER_MARKER, ".workbench.lock", PARTIAL_MARKER)  # our own bookkeeping files, never user data


def _files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def write_owner_marker(folder: str | Path, kind: str) -> Path:
    """Record that the workbench wrote `folder` and which files it holds (call when the folder is complete)."""
    folder = Path(folder)
    files = [f for f in _files_under(folder) if f not in _INTERNAL]
    return atomic_write_json(folder / OWNER_MARKER, {"written_by": "speculators-workbench", "kind": kind,
                                                     "files": files})


def _recorded(folder: Path) -> set[str]:
    """The names the owner marker of `folder` records as written by the workbench (none without a valid marker)."""
    try:
        marker = read_json(folder / OWNER_MARKER)
        return set(marker["files"]) if marker.get("written_by") == "speculators-workbench" else set()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def _covered(name: str, ours: set[str]) -> bool:
    """`name` (a relative path) is recorded, or lies under a recorded folder."""
    parts = name.split("/")
    return any("/".join(parts[:i]) in ours for i in range(1, len(parts) + 1))


def foreign_files(folder: str | Path, limit: int | None = None) -> list[str]:
    """Files in `folder` that the workbench did not write (all of them when it holds no valid marker).

    Stops after `limit` of them (a folder such as a home directory can hold millions of files).
    """
    folder = Path(folder)
    ours = _recorded(folder)
    found: list[str] = []
    for p in folder.rglob("*"):
        if p.is_dir():
            continue
        name = p.relative_to(folder).as_posix()
        if name not in _INTERNAL and not _covered(name, ours):
            found.append(name)
            if limit is not None and len(found) >= limit:
                break
    return sorted(found)


def is_ours(folder: str | Path, also_ours=None) -> bool:
    """True for a folder the workbench wrote: every file is listed in its owner marker, or it is one of
    `atomic_directory`'s unfinished temp folders (partial marker), or `also_ours(folder)` vouches for it."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return False
    if (folder / PARTIAL_MARKER).is_file():
        return True
    if (folder / OWNER_MARKER).is_file() and not foreign_files(folder, limit=1):
        return True
    return bool(also_ours is not None and also_ours(folder))


def remove_ours(folder: str | Path, also_ours=None) -> bool:
    """Delete `folder` only if the workbench wrote it (`is_ours`); otherwise leave it and say so. True if removed."""
    folder = Path(folder)
    if not is_ours(folder, also_ours):
        if folder.exists():
            log.warning("not removing %s: the workbench did not write it (or files were added to it)", folder)
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def check_replaceable(final: str | Path, *, overwrite: bool = False, what: str = "output folder",
                      flag: str = "--overwrite", also_ours=None) -> None:
    """Refuse to replace `final` unless it is absent, empty, written by us, or `overwrite` is given.

    `also_ours(folder)` may vouch for a folder written before markers existed.
    """
    final = Path(final)
    if not final.exists() and not final.is_symlink():
        return
    if not final.is_dir() or final.is_symlink():
        raise WorkbenchError(f"the {what} exists and is not a folder", where=str(final),
                             hint="choose another output path (nothing was written)")
    if overwrite:
        return
    foreign = foreign_files(final, limit=6)
    if not foreign or (also_ours is not None and also_ours(final)):
        return
    shown = ", ".join(foreign[:5]) + (" and more" if len(foreign) > 5 else "")
    raise WorkbenchError(
        f"the {what} already exists and holds files the workbench did not write ({shown}); replacing it would "
        "delete them", where=str(final),
        hint=f"choose a new or empty folder, or add {flag} to replace it (everything in it is deleted)")


def claim_names(folder: str | Path, names: Iterable[str], *, kind: str, what: str = "output folder",
                flag: str = "--out", overwrite: bool = False, overwrite_flag: str | None = None) -> Path:
    """Before a command writes `names` (files or folders, relative) into `folder` in place, refuse if one of them
    exists and the folder's owner marker does not record it as written by the workbench; else record them."""
    # The record is made before anything is written, so a file the command leaves (also after a crash) is ours on
    # the next run, and a file a user put there keeps blocking the write. `overwrite` (the user's explicit consent,
    # given with `overwrite_flag`) replaces them anyway. Nothing is changed when refused.
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise WorkbenchError(f"the {what} exists and is not a folder", where=str(folder),
                             hint=f"give {flag} a new folder (nothing was written)")
    names = sorted(set(names))
    ours = _recorded(folder)
    clashes = [n for n in names if (folder / n).exists() and not _covered(n, ours)] if not overwrite else []
    if clashes:
        shown = ", ".join(clashes[:5]) + (f" and {len(clashes) - 5} more" if len(clashes) > 5 else "")
        raise WorkbenchError(
            f"the {what} holds {shown}, which the workbench did not write; writing here would replace "
            f"{'it' if len(clashes) == 1 else 'them'} (nothing was changed)", where=str(folder / clashes[0]),
            hint=f"give {flag} a new or empty folder, or move {clashes[0]} out of {folder}"
            + (f", or add {overwrite_flag} to replace it" if overwrite_flag else ""))
    if not set(names) <= ours:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / OWNER_MARKER, {"written_by": "speculators-workbench", "kind": kind,
                                                  "files": sorted(ours | set(names))})
    return folder


def release_names(folder: str | Path, names: Iterable[str]) -> None:
    """Drop `names` (files the workbench wrote into `folder` and has removed) from its owner marker, so that a file
    of the user's later put under one of those names is not taken for ours."""
    folder, names = Path(folder), set(names)
    ours = _recorded(folder)
    if ours & names:
        marker = read_json(folder / OWNER_MARKER)
        atomic_write_json(folder / OWNER_MARKER, {**marker, "files": sorted(ours - names)})


@contextlib.contextmanager
def atomic_directory(final: str | Path, *, owner: str | None = None, overwrite: bool = False,
                     also_ours=None) -> Iterator[Path]:
    """Yield a fresh temp folder next to `final`; on success it replaces `final` in one rename."""
    # If the body raises, the temp folder is removed and `final` (if it existed) is untouched. With `owner`
    # (what the folder is, e.g. "draft") the folder gets an ownership marker, and an existing `final` is only
    # replaced when it is empty or was written by us (see `check_replaceable`), or with `overwrite`.
    # Files created inside get the umask's modes (some writers, e.g. safetensors, create them private).
    final = Path(final)
    if owner is not None:
        check_replaceable(final, overwrite=overwrite, also_ours=also_ours)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    os.chmod(tmp, dir_mode())
    (tmp / PARTIAL_MARKER).touch()  # a leftover of an interrupted write is recognisably ours
    try:
        yield tmp
        (tmp / PARTIAL_MARKER).unlink(missing_ok=True)
        _public_modes(tmp)
        if owner is not None:
            write_owner_marker(tmp, owner)
            check_replaceable(final, overwrite=overwrite, also_ours=also_ours)  # it may have appeared meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _public_modes(folder: Path) -> None:
    """Give private (group/other-less) files and folders under `folder` the umask's modes."""
    fmode, dmode = file_mode(), dir_mode()
    for p in folder.rglob("*"):
        if p.is_symlink():
            continue
        mode = p.stat().st_mode & 0o777
        if mode & 0o077:
            continue  # the writer chose a shared mode itself
        if p.is_dir():
            os.chmod(p, dmode)
        else:
            os.chmod(p, dmode if mode & 0o100 else fmode)


def read_json(path: str | Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@contextlib.contextmanager
def exclusive_lock(lock_file: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `lock_file` (created if absent) while the block runs; other processes wait.
    `on_wait` is called once when another process holds it (to say why this one pauses)."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# Digests of tensors (not of files): the same tensors give the same digest however they are sharded or named on disk
# ---------------------------------------------------------------------------------------------------

_DIGEST_CHUNK = 16 << 20
_TORCH_TO_SAFETENSORS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
                         "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def safetensors_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """(header, offset of the data section) of a .safetensors file, read without loading a tensor.

    Raises WorkbenchError naming the file when the header cannot be read (truncated or not safetensors)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 0 or 8 + n > size:
            raise WorkbenchError(f"{path} is not a readable .safetensors file (header length {n}, file size {size})",
                                 hint="re-write the file (re-run the step that made it) or remove it")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError) as exc:
            raise WorkbenchError(f"{path} has a corrupt .safetensors header ({exc})",
                                 hint="re-write the file (re-run the step that made it) or remove it") from None
    if not isinstance(header, dict):
        raise WorkbenchError(f"{path} has a corrupt .safetensors header (not a mapping)",
                             hint="re-write the file (re-run the step that made it) or remove it")
    return header, 8 + n


def _digest_entry(h, name: str, dtype: str, shape: list[int]) -> None:
    h.update(json.dumps([name, dtype, list(shape)]).encode())


def tensors_digest(files: Iterable[str | Path]) -> str:
    """sha256 over every tensor of the given .safetensors files: (name, dtype, shape, bytes) in name order.

    File names, shard boundaries, metadata and header order do not count; a changed value does."""
    import hashlib

    entries: dict[str, tuple[Path, str, list[int], int, int]] = {}
    for path in files:
        header, base = safetensors_header(path)
        size = Path(path).stat().st_size
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = (int(x) for x in info["data_offsets"])
                dtype, shape = str(info["dtype"]), [int(x) for x in info["shape"]]
            except (KeyError, TypeError, ValueError):
                raise WorkbenchError(f"{path} has a corrupt .safetensors header (entry {name!r})",
                                     hint="re-write the file or remove it") from None
            if name in entries:
                raise WorkbenchError(f"tensor {name!r} is in both {entries[name][0]} and {path}",
                                     hint="keep one copy of each tensor (an old shard may be left over)")
            if not 0 <= begin <= end or base + end > size:
                raise WorkbenchError(f"{path}: tensor {name!r} lies past the end of the file (truncated?)",
                                     hint="re-write the file or remove it")
            entries[name] = (Path(path), dtype, shape, base + begin, base + end)
    h = hashlib.sha256()
    for name in sorted(entries):
        path, dtype, shape, begin, end = entries[name]
        _digest_entry(h, name, dtype, shape)
        with open(path, "rb") as f:
            f.seek(begin)
            left = end - begin
            while left > 0:
                chunk = f.read(min(left, _DIGEST_CHUNK))
                if not chunk:
                    raise WorkbenchError(f"{path} ended early while reading {name!r}", hint="re-write the file")
                h.update(chunk)
                left -= len(chunk)
    return "sha256:" + h.hexdigest()


def tensors_digest_of(tensors: dict) -> str:
    """The `tensors_digest` that a .safetensors file holding exactly these (contiguous CPU) tensors will have."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        _digest_entry(h, name, _TORCH_TO_SAFETENSORS[str(t.dtype).replace("torch.", "")], list(t.shape))
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return "sha256:" + h.hexdigest()
