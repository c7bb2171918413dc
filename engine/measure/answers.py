"""The target's held-out greedy answers and the hidden states a draft reads, kept so a later evaluation reads them."""

# An entry is one safetensors file under `<workbench home>/answers/`, named by the hash of everything that determines
# its content: the target (folder and a hash of its weight files), its dtype and kernel path, the CPU and torch that
# ran it (kernels round differently elsewhere), the prompts, the token budget, the EOS ids and the layers read. The
# file repeats that key in its metadata and is read only when it matches, so a changed target, dtype or kernel path
# never gets stale answers. Files are written atomically under a file lock (concurrent jobs), and the oldest are
# removed past a size bound ($WORKBENCH_ANSWERS_MAX_MB, default 2048).

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from engine.cpu import cpu_flags, cpu_model
from engine.fsutil import atomic_save_safetensors, atomic_write_json, exclusive_lock, read_json, workbench_home

log = logging.getLogger(__name__)

STORE_FORMAT = 1  # bump when what an entry holds changes
DEFAULT_MAX_MB = 2048


def store_dir() -> Path:
    return workbench_home() / "answers"


def max_bytes() -> int:
    return int(float(os.environ.get("WORKBENCH_ANSWERS_MAX_MB", DEFAULT_MAX_MB)) * 2**20)


@contextmanager
def _locked():
    folder = store_dir()
    with exclusive_lock(folder / ".lock"):
        yield folder


def weights_hash(folder: str | os.PathLike) -> str:
    """sha256 over a target folder's weight files; remembered per (name, size, mtime) so it is computed once."""
    folder = Path(folder)
    files = sorted(p for p in folder.glob("*") if p.suffix in (".safetensors", ".bin", ".json") and p.is_file())
    stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    memo_key = hashlib.sha256(json.dumps([str(folder.resolve()), stamp]).encode()).hexdigest()[:24]
    memo = store_dir() / "weights" / f"{memo_key}.json"
    try:
        return read_json(memo)["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    atomic_write_json(memo, {"folder": str(folder), "files": stamp, "sha256": digest.hexdigest()})
    return digest.hexdigest()


def answers_key(target, prompts: Sequence[Any], aux_layer_ids: Sequence[int], *, max_new_tokens: int,
                eos_token_ids: Sequence[int]) -> dict[str, Any]:
    """Everything the target's answers and states depend on (engine.targets.loading.Target as loaded for decoding)."""
    kernel = target.extra.get("kernel") or {}
    return {
        "format": STORE_FORMAT, "target": target.ref.name, "target_path": target.ref.path,
        "weights_sha256": weights_hash(target.ref.path) if Path(target.ref.path).is_dir() else target.ref.path,
        "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
        "kernel_path": kernel.get("path"), "routed": bool(target.extra.get("route_kernels", True)),
        "cpu": cpu_model() if target.device.type == "cpu" else None,
        "cpu_flags": hashlib.sha256(",".join(sorted(cpu_flags())).encode()).hexdigest()[:16],
        "torch": torch.__version__,
        "prompts_sha256": hashlib.sha256(json.dumps(list(prompts), sort_keys=True, default=str).encode()).hexdigest(),
        "num_prompts": len(prompts), "max_new_tokens": int(max_new_tokens),
        "eos_token_ids": sorted(int(t) for t in eos_token_ids), "layers": sorted(int(i) for i in aux_layer_ids),
    }


def entry_path(key: dict[str, Any]) -> Path:
    return store_dir() / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]}.safetensors"


def load(key: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The stored rows ({token_ids [T], aux [T, A*H], prompt_len, end, id}) for exactly this key, or None."""
    from safetensors import safe_open

    path = entry_path(key)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if json.loads(meta.get("key", "null")) != key:
                return None
            rows = json.loads(meta["rows"])
            tokens, aux = f.get_tensor("token_ids"), f.get_tensor("aux")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type for a damaged file
        log.warning("ignoring an unreadable answers entry %s: %s", path.name, exc)
        return None
    out = []
    for row in rows:
        a, b = row["start"], row["start"] + row["length"]
        out.append({"token_ids": tokens[a:b].clone(), "aux": aux[a:b].clone(), "prompt_len": row["prompt_len"],
                    "end": row["end"], "id": row["id"]})
    os.utime(path)  # recently used: pruned last
    return out


def save(key: dict[str, Any], rows: Sequence[dict[str, Any]]) -> Path | None:
    """Store rows for `key` (atomically, under the lock), then prune the oldest entries past the size bound."""
    tokens = torch.cat([r["token_ids"].long() for r in rows])  # [sum T]
    aux = torch.cat([r["aux"].float() for r in rows])  # [sum T, A*H]
    size = tokens.numel() * 8 + aux.numel() * 4
    if size > max_bytes():
        log.info("answers of %d bytes exceed the store's bound; not kept", size)
        return None
    index, start = [], 0
    for r in rows:
        n = int(r["token_ids"].numel())
        index.append({"start": start, "length": n, "prompt_len": int(r["prompt_len"]), "end": int(r["end"]),
                      "id": str(r["id"])})
        start += n
    with _locked():
        path = atomic_save_safetensors({"token_ids": tokens, "aux": aux}, entry_path(key),
                                       metadata={"key": json.dumps(key), "rows": json.dumps(index)})
        prune(max_bytes(), keep=path)
    return path


ENTRY_NAME = re.compile(r"[0-9a-f]{24}\.safetensors")  # what entry_path names a file


def is_entry(path: Path) -> bool:
    """A file this store wrote: an entry's name and an entry's metadata (its key and row index)."""
    from safetensors import safe_open

    if not ENTRY_NAME.fullmatch(path.name):
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception:  # noqa: BLE001 - not a safetensors file: not ours either
        return False
    return "key" in meta and "rows" in meta


def prune(limit: int, keep: Path | None = None) -> None:
    """Remove the least recently used entries (never `keep`) until the store holds at most `limit` bytes (call under
    the lock). Only files the store wrote are counted or removed."""
    entries = sorted((p for p in store_dir().glob("*.safetensors") if is_entry(p)), key=lambda p: p.stat().st_mtime_ns)
    total = sum(p.stat().st_size for p in entries)
    for p in entries:
        if total <= limit:
            break
        if keep is not None and p.name == keep.name:
            continue
        total -= p.stat().st_size
        p.unlink(missing_ok=True)


def samples(target, prompts: Sequence[Any], aux_layer_ids: Sequence[int], *, max_new_tokens: int,
            eos_token_ids: Sequence[int], compute: Callable[[], list], make: Callable[..., Any]) -> list:
    """The held-out samples for these prompts: read from the store when present, else `compute()`d and stored.

    `compute` returns samples with token_ids, aux, prompt_len, end and id; `make(**row)` builds one from a row.
    """
    key = answers_key(target, prompts, aux_layer_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
    rows = load(key)
    if rows is not None:
        log.info("target answers read from the store (%s)", entry_path(key).name)
        return [make(**r) for r in rows]
    out = compute()
    save(key, [{"token_ids": s.token_ids, "aux": s.aux, "prompt_len": s.prompt_len, "end": s.end, "id": s.id}
               for s in out])
    return out
