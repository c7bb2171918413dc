"""Where a measured figure comes from: the CPU and the date a record names, and whether that is this machine."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

from engine.cpu import CPU_KINDS, cpu_identity, kind_named
from engine.errors import WorkbenchError
from engine.format.checkpoint import weights_sha256
from engine.weightfiles import weight_files

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "benchmarks" / "results"  # records that ship with the project
SAME_KIND = "a CPU of this kind"  # a shipped record's CPU matches this machine's kind: not "this machine"


@functools.lru_cache(maxsize=1)
def this_cpu() -> dict[str, str]:
    """{"cpu": model name, "cpu_kind": ...} of this machine (engine.cpu.cpu_identity)."""
    return cpu_identity()


def _known(value: Any) -> str | None:
    """A record's field as text; None when absent or recorded as "unknown (why)" (records filled in after the fact)."""
    return str(value) if value and not str(value).startswith("unknown") else None


def cpu_of(record: dict[str, Any]) -> str | None:
    return _known(record.get("cpu"))


def kind_of(record: dict[str, Any]) -> str | None:
    """The record's CPU kind (engine.cpu.CPU_KINDS): its `cpu_kind`, else the kind its CPU description names
    ("AMD EPYC (2 cores, AVX-512 BF16, native bf16)"); None when it names none."""
    kind = record.get("cpu_kind")
    return kind if kind in CPU_KINDS else kind_named(cpu_of(record))


def on_this_machine(record: dict[str, Any]) -> bool:
    """The record was measured on a CPU of this machine's kind (AMX, AVX-512 BF16, AVX2: what sets the speed of a
    bf16 step, not the brand: a Zen 4 record is not an AVX2 EPYC's; an "other" kind also needs the same model).
    A record naming no kind is not counted."""
    kind, here = kind_of(record), this_cpu()
    return kind is not None and kind == here["cpu_kind"] and (kind != "other" or cpu_of(record) == here["cpu"])


@functools.lru_cache(maxsize=256)
def _first_commit_date(path: str, mtime: float) -> str | None:
    """When a shipped record was first committed ("2026-12-01 10:22:33", from `git log`), or None outside a git
    checkout."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ci", "--", path], cwd=ROOT,
                             capture_output=True, text=True, timeout=10, check=False).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[-1][:19] if out else None


def date_of(record: dict[str, Any], path: str | Path | None = None) -> str | None:
    """The record's own `date`, else (a shipped record) the day it was committed, else None."""
    if _known(record.get("date")):
        return str(record["date"])
    if path is not None and Path(path).is_file():
        p = Path(path).resolve()
        if p.is_relative_to(ROOT):
            return _first_commit_date(str(p.relative_to(ROOT)), p.stat().st_mtime)
    return None


def provenance(record: dict[str, Any], path: str | Path | None = None, *, shipped: bool = False) -> str:
    """"this machine (Intel Xeon ..., AMX), 2026-12-01", "a CPU of this kind (AMD EPYC, AVX2), 2026-12-04" (`shipped`:
    a record that came with the project never ran here) or "another machine: AMD EPYC, AVX-512 BF16, committed
    2026-11-28"."""
    cpu, date, kind = cpu_of(record), date_of(record, path), kind_of(record)
    cpu = f"{cpu}, {kind}" if cpu and kind and kind not in cpu else cpu  # the kind is what tells two EPYCs apart
    when = ("" if not date else f", {date[:10]}" if _known(record.get("date")) else f", committed {date[:10]}")
    if cpu is None:
        return f"CPU not recorded{when}"
    if on_this_machine(record):
        return f"{SAME_KIND if shipped else 'this machine'} ({cpu}){when}"
    return f"another machine: {cpu}{when}"


def same_draft(a: str | None, b: str | None) -> bool:
    """Two names of one draft folder: equal resolved paths, or (a shipped record's path from another checkout) the
    same `drafts/NAME` tail."""
    if not a or not b:
        return False
    pa, pb = Path(a), Path(b)
    if pa.exists() and pb.exists() and pa.resolve() == pb.resolve():
        return True
    return len(pa.parts) >= 2 and pa.parts[-2:] == pb.parts[-2:] and pa.parts[-2] == "drafts"


def measured(record: dict[str, Any] | None, draft: str | None) -> bool:
    """Whether `record` measured this draft folder: it names the folder, or it measured the same weight files
    (its `draft_sha256`) under another name (a recipe measures its training folder, then ships the same bytes)."""
    record = record or {}
    if same_draft(record.get("draft"), draft):
        return True
    digest = record.get("draft_sha256")
    return bool(digest) and digest == weights_digest(draft)


def weights_digest(draft: str | None) -> str | None:
    """sha256 of a draft folder's weights (what records store as `draft_sha256`), cached while its files are
    unchanged; None without readable weights."""
    try:
        files = weight_files(draft) if draft else []
        stamps = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    except (WorkbenchError, OSError):
        return None
    return _digest(str(Path(draft).resolve()), stamps) if files else None


@functools.lru_cache(maxsize=16)
def _digest(folder: str, stamps: tuple) -> str:  # `stamps` only keys the cache: new files, new digest

    return weights_sha256(folder)


def of_these_weights(recs: dict[str, dict[str, Any]], draft: str) -> set[str]:
    """The keys of `recs` (records naming this draft folder) that measured its current weights: those whose
    `draft_sha256` is the folder's; records from before the digest was kept count only when none has it.
    A re-shipped draft keeps its folder, so the name alone would credit it with its predecessor's figures."""
    digest = weights_digest(draft)
    exact = {k for k, r in recs.items() if digest and r.get("draft_sha256") == digest}
    return exact or {k for k, r in recs.items() if not r.get("draft_sha256")}


def shipped_json(predicate) -> list[Path]:
    """benchmarks/results/**/*.json whose content satisfies `predicate(data)`, sorted by path."""
    import json

    out = []
    if SHIPPED.is_dir():
        for p in sorted(SHIPPED.rglob("*.json")):
            try:
                if predicate(json.loads(p.read_text())):
                    out.append(p)
            except (OSError, ValueError, AttributeError, TypeError):
                continue
    return out
