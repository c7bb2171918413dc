"""Glue for the Data page: where uploaded datasets and job outputs go, and the command lines of data jobs."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from engine.algos import algorithm_names
from engine.data.extract.layer_ids import resolve_layer_ids
from engine.data.extract.run import estimate_bytes, human_bytes
from engine.data.options import ExtractOptions, PrepareOptions, RegenerateOptions
from engine.data.store.files import read_manifest
from engine.jobs import runs_dir

__all__ = ["BUILTIN", "algorithm_names", "default_extract_out", "default_regen_out", "extract_argv",
           "extraction_folders", "manifest", "prepare_argv", "regenerate_argv", "save_upload", "slug"]

BUILTIN = "sharegpt"


def save_upload(name: str, data: bytes) -> str:
    """Keep an uploaded dataset under runs/uploads/ (jobs read it from there); same content, same file."""
    digest = hashlib.sha256(data).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name) or "dataset.jsonl"
    folder = runs_dir() / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{Path(safe).stem}-{digest}{Path(safe).suffix or '.jsonl'}"
    if not path.exists():
        from engine.fsutil import atomic_write_bytes

        atomic_write_bytes(path, data)
    return str(path)


def slug(dataset: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", Path(dataset).stem if "/" in dataset else dataset)[:40]


def default_regen_out(dataset: str) -> str:
    return str(runs_dir() / "data" / f"{slug(dataset)}-regenerated.jsonl")


def default_extract_out(dataset: str, target: str) -> str:
    return str(runs_dir() / "data" / f"{slug(dataset)}-{slug(target)}-hidden-states")


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The form's values the user gave (None: left to the options' default)."""
    return {name: value for name, value in values.items() if value is not None}


def regenerate_argv(values: dict[str, Any]) -> list[str]:
    """The `regenerate` command of the form's values (RegenerateOptions fields)."""
    return RegenerateOptions(**_given(values)).argv("regenerate")


def extract_argv(values: dict[str, Any]) -> list[str]:
    """The `extract` command of the form's values (ExtractOptions fields): layer ids, when given, over the
    algorithm's."""
    given = _given(values)
    layers = str(given.pop("layers", "") or "").replace(" ", "")
    if layers:
        given.pop("algo", None)
        given["layers"] = layers
    return ExtractOptions(**given).argv("extract")


def prepare_argv(values: dict[str, Any]) -> list[str]:
    """The `prepare` command of the form's values (PrepareOptions fields)."""
    return PrepareOptions(**_given(values)).argv("prepare")


def manifest(out: str) -> dict[str, Any] | None:
    return read_manifest(out) if Path(out).is_dir() else None


def extraction_folders() -> list[str]:
    """Folders under runs/ that hold an extraction manifest (for the Train page's `data`)."""
    root = runs_dir()
    if not root.is_dir():
        return []
    found = []
    for depth in range(1, 5):
        found += [str(p.parent) for p in sorted(root.glob("/".join(["*"] * depth) + "/manifest.json"))]
    return found


def disk_estimate(target_path: str, preview: list[dict[str, Any]], *, samples: int | None, max_length: int,
                  algo: str, layers: str, dtype: str) -> str | None:
    """What an extraction would write, from the previewed rows' mean length and the target's config (no weights):
    a sentence, or None when it cannot be estimated."""
    from transformers import AutoConfig


    lengths = [min(int(r["tokens"]), max_length) for r in preview if r.get("tokens")]
    if not lengths:
        return None
    try:
        config = AutoConfig.from_pretrained(target_path)
    except (OSError, ValueError):
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        ids = resolve_layer_ids(int(text.num_hidden_layers), layers or None, algo)
    except Exception:  # noqa: BLE001 - a bad layer list is reported by the job; no estimate meanwhile
        return None
    mean = sum(lengths) / len(lengths)
    n = samples or 1000
    size = estimate_bytes(int(mean * n), n, len(ids), int(text.hidden_size), dtype)
    return (f"About {human_bytes(size)} on disk for {n if samples else 'every 1,000'} samples "
            f"(~{mean:.0f} tokens each, from the preview; {len(ids)} layers × {text.hidden_size} values × {dtype}). "
            "The job checks the free space before it starts.")
