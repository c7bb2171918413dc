"""Which files hold a checkpoint's weights: the safetensors shards its index names, or its one file; pickles refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.errors import WorkbenchError

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def pickle_files(folder: Path) -> list[Path]:
    """The pickled weight files of a folder (never loaded unless the user allows it)."""
    return sorted(f for f in folder.iterdir() if f.suffix in PICKLE_SUFFIXES)


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """The safetensors files of a checkpoint folder (via the shard index when there is one)."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise WorkbenchError(f"{INDEX_NAME} is malformed ({exc})", where=str(folder)) from exc
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise WorkbenchError(f"{INDEX_NAME}: weight_map must map tensor names to shard file names",
                                 where=str(folder), hint="re-save the checkpoint")
        outside = sorted({f for f in weight_map.values() if not _inside(f)})
        if outside:
            raise WorkbenchError(f"{INDEX_NAME} lists shards outside the draft folder: {outside[:3]}; only file names "
                                 "inside the folder are read", where=str(folder),
                                 hint="copy the shards into the folder and list them by file name")
        files = sorted({folder / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WorkbenchError(f"shards listed in {INDEX_NAME} are missing: {missing}", where=str(folder))
        return files
    if (folder / WEIGHTS_NAME).is_file():
        return [folder / WEIGHTS_NAME]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if pickle_files(folder):
        raise WorkbenchError(
            f"only pickled weights ({', '.join(f.name for f in pickle_files(folder))}) found; they are not "
            "loaded by default because unpickling can run arbitrary code",
            where=str(folder),
            hint="convert them to model.safetensors, or pass allow_pickle=True (--allow-pickle) if you trust the "
            "file (loaded with torch.load(weights_only=True))",
        )
    raise WorkbenchError("no model.safetensors in the folder", where=str(folder),
                         hint="save the weights as safetensors")


def _inside(name: str) -> bool:
    """A shard name of an index: relative, and inside the folder written as it is (symlinked files are fine)."""
    norm = os.path.normpath(name)
    return bool(name) and not os.path.isabs(name) and not norm.startswith("..") and "\\" not in name \
        and norm != "."
