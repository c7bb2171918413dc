"""Regenerated conversations kept in the repository (gzip + provenance): data grown on several machines is paid once."""

#   assets/regenerated/<name>.jsonl.gz         the rows `regenerate` wrote (gzip, no timestamp: same rows, same bytes)
#   assets/regenerated/<name>.provenance.json  target, the settings that make the answers what they are, rows, sha256
#
# `keep` writes both from a work JSONL (only files the workbench wrote there are replaced), after the rows already kept
# with the same settings; `seed` appends to a work JSONL the kept rows of the run's selection it lacks, when the
# provenance's settings are the run's, so `regenerate` then skips them and only new rows cost generation. Kept rows
# from other settings are never mixed in: `seed` says why and adds nothing.

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_bytes, atomic_write_json, claim_names, read_json

log = logging.getLogger(__name__)

KEPT_DIR = Path(__file__).resolve().parents[3] / "assets" / "regenerated"
# The regenerate settings that decide what an answer is: rows made under others are other data.
ANSWER_SETTINGS = ("target", "dataset", "split", "val_fraction", "seed", "max_new_tokens", "temperature", "top_p",
                   "max_turns", "max_length", "backend")
DEFAULTS = {"dataset": "sharegpt", "split": "train", "val_fraction": 0.02, "seed": 0, "max_new_tokens": 256,
            "temperature": 0.0, "top_p": 1.0, "max_turns": None, "max_length": None, "backend": "transformers"}


def kept_paths(name: str, folder: str | Path = KEPT_DIR) -> tuple[Path, Path]:
    """(<name>.jsonl.gz, <name>.provenance.json) under `folder`."""
    folder = Path(folder)
    return folder / f"{name}.jsonl.gz", folder / f"{name}.provenance.json"


def answer_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The settings of a regenerate run that decide its answers (defaults filled in)."""
    return {k: options.get(k, DEFAULTS.get(k)) for k in ANSWER_SETTINGS}


def selection_ids(options: dict[str, Any]) -> set[str]:
    """The ids of the conversations a regenerate run with these options answers (dataset, split, max_samples)."""
    from engine.data.render.datasets import load_conversations

    settings = answer_settings(options)
    rows, _ = load_conversations(settings["dataset"], split=settings["split"], val_fraction=settings["val_fraction"],
                                 seed=settings["seed"], max_samples=options.get("max_samples"), prompt_only=True)
    return {str(r["id"]) for r in rows}


def keep(name: str, jsonl: str | Path, options: dict[str, Any], folder: str | Path = KEPT_DIR) -> dict[str, Any]:
    """Write `jsonl`'s rows (gzip), after the rows already kept under the same settings, and their provenance under
    `folder`; returns the provenance. A smaller run never shrinks what is kept, and one that adds nothing rewrites
    nothing."""
    data_path, prov_path = kept_paths(name, folder)
    claim_names(Path(folder), [data_path.name, prov_path.name], kind="kept-regenerated",
                what="kept-data folder", flag="the recipe's `keep_regenerated:`")
    raw = Path(jsonl).read_bytes()
    raw = raw[: raw.rfind(b"\n") + 1]  # complete rows only
    settings = answer_settings(options)
    before = read_kept(name, folder)
    same_settings = before is not None and before[1].get("settings") == settings
    if same_settings:
        known = {str(json.loads(line)["id"]) for line in before[0]}
        added = [line for line in raw.splitlines() if line.strip() and str(json.loads(line)["id"]) not in known]
        lines = before[0] + added
        raw = b"".join(line + b"\n" for line in lines)
    sha256 = hashlib.sha256(raw).hexdigest()
    if same_settings and before[1].get("sha256") == sha256:
        return before[1]  # nothing new: both files stay as they are (no new timestamp)
    rows = sum(1 for line in raw.splitlines() if line.strip())
    provenance = {"name": name, "settings": settings, "rows": rows,
                  "sha256": sha256, "bytes": len(raw),
                  "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "written_by": "speculators-workbench"}
    atomic_write_bytes(data_path, gzip.compress(raw, compresslevel=9, mtime=0))
    atomic_write_json(prov_path, provenance)
    log.info("kept %d regenerated rows in %s (%d bytes gzip)", rows, data_path, data_path.stat().st_size)
    return provenance


def read_kept(name: str, folder: str | Path = KEPT_DIR) -> tuple[list[bytes], dict[str, Any]] | None:
    """(row lines, provenance) of kept data, checked against its sha256; None when nothing is kept."""
    data_path, prov_path = kept_paths(name, folder)
    if not (data_path.is_file() and prov_path.is_file()):
        return None
    provenance = read_json(prov_path)
    raw = gzip.decompress(data_path.read_bytes())
    if hashlib.sha256(raw).hexdigest() != provenance.get("sha256"):
        raise WorkbenchError(f"{data_path} does not match its provenance (sha256 differs)", where=str(data_path),
                             hint=f"restore both files from git (git checkout -- {data_path.parent}), or delete both")
    return [line for line in raw.splitlines() if line.strip()], provenance


def seed(name: str, jsonl: str | Path, options: dict[str, Any], folder: str | Path = KEPT_DIR,
         ids: set[str] | None = None) -> int:
    """Append to the work `jsonl` the kept rows it lacks when the settings agree, only those whose id is in `ids`
    (the run's own selection: a smaller run does not train on more) when given; returns how many were added."""
    from engine.data.answers.regenerate import append_rows, is_own_row, open_output

    kept = read_kept(name, folder)
    if kept is None:
        return 0
    lines, provenance = kept
    want = answer_settings(options)
    if provenance.get("settings") != want:
        differ = [k for k in ANSWER_SETTINGS if provenance.get("settings", {}).get(k) != want[k]]
        log.warning("kept data %s was made with other settings (%s): not used", kept_paths(name, folder)[0],
                    ", ".join(differ))
        return 0
    rows = [json.loads(line) for line in lines]
    if not all(is_own_row(r) for r in rows):
        raise WorkbenchError(f"{kept_paths(name, folder)[0]} holds rows regenerate did not write",
                             hint="restore it from git, or delete it and its provenance file")
    f, done = open_output(Path(jsonl))  # locked; refuses a file regenerate did not write
    try:
        new = [r for r in rows if str(r["id"]) not in done and (ids is None or str(r["id"]) in ids)]
        append_rows(f, new)
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()
    log.info("seeded %d kept regenerated rows into %s", len(new), jsonl)
    return len(new)
