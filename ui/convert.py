"""Glue for the Convert page: stage uploaded checkpoints, show the engine's detection, mapping table and dry run,
zip results.

Staging, zip checks, detection, mapping and the dry run are `engine.convert` (the page only lays them out); the
conversion itself is `python -m engine convert` as a job.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.convert import CONVERTERS, ConvertOptions, detect_source, inputs, mapping_rows, plan
from engine.convert.base import UNMAPPED, ConvertJob
from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import read_config_dict
from engine.format.config import config_type
from engine.fsutil import atomic_write_bytes
from engine.jobs import runs_dir
from engine.llamacpp.options import ExportOptions

SPECULATORS, UNKNOWN = "speculators", "unknown"  # engine.convert.detect's formats besides its converters
STAGED_TTL_S = inputs.STAGED_TTL_S

@dataclass
class Detection:
    folder: str
    format: str
    title: str
    kind: str = "unknown"
    algorithm: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    mapping: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""
    instead: str = ""
    options: tuple[str, ...] = ()  # the ConvertOptions fields the converter reads
    detected: str = ""  # the format detection found (`format` may be the user's choice)


def uploads_dir() -> Path:
    return runs_dir() / "uploads"


def stage(files: Iterable[tuple[str, bytes]]) -> Path:
    """Write uploaded files (config.json + *.safetensors, or one zip) into runs/uploads/convert-<hash>/.

    Keyed by the content hash: the same upload is written (and its zip extracted) once and reused on every
    rerun; the folder appears complete or not at all; stale staged uploads are removed.
    """
    files = list(files)
    if not files:
        raise WorkbenchError("nothing uploaded", hint="drop config.json and the .safetensors files, or a zip")
    digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() + n.encode() for n, d in files)).hexdigest()[:12]

    def write(tmp: Path) -> None:
        for name, data in files:
            base = Path(name).name
            if base.endswith(".zip"):
                inputs.extract_zip(io.BytesIO(data), tmp, name=base, size=len(data))
            else:
                atomic_write_bytes(tmp / base, data)

    return inputs.checkpoint_root(inputs.staged(uploads_dir(), f"convert-{digest}", write))


def still_staged(folder: str | Path) -> bool:
    """Whether a staged upload is still on disk (marking it as used)."""
    import os

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return False
    for p in (folder, *folder.parents):
        if p.parent == uploads_dir():
            os.utime(p)
            break
    return True


def prune_staged(keep: Path | None = None, now: float | None = None) -> list[Path]:
    return inputs.prune_staged(uploads_dir(), keep=keep, now=now)


def resolve_input(path: str) -> Path:
    """A local checkpoint folder, weights file or .zip path (extracted under runs/uploads/): its folder."""
    return inputs.open_source(path, staging=uploads_dir()).folder


def format_choices() -> list[str]:
    """The source layouts the engine's converters read (the registry, as the CLI's --format)."""
    return CONVERTERS.names()


def format_title(name: str) -> str:
    return CONVERTERS.get(name).title if name in CONVERTERS else name


def option_help(name: str) -> str:
    """The engine's description of a conversion option (ConvertOptions)."""
    return ConvertOptions.model_fields[name].description or ""


def detect(folder: str | Path, fmt: str | None = None) -> Detection:
    """The engine's detection of a source folder, with the facts, notes and mapping rows the page shows; `fmt`
    (a registered converter) reads it as that layout instead of the detected one."""
    source = inputs.open_source(folder, staging=uploads_dir())
    cfg = source.config
    found = detect_source(source)
    det = Detection(str(source.folder), found.format, found.title, kind=found.kind, algorithm=found.algorithm,
                    why=found.why, instead=found.instead, detected=found.format)
    keys = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size", "draft_vocab_size",
            "target_hidden_size", "speculators_model_type")
    det.facts = {k: cfg.get(k) for k in keys if k in cfg} | {"tensors": len(found.index)}
    if fmt and fmt != found.format and fmt in CONVERTERS and found.kind != SPECULATORS:
        chosen = CONVERTERS.get(fmt)
        det.format, det.title, det.kind, det.algorithm = fmt, chosen.title, "convertible", chosen.algorithm
    if det.kind == "convertible":
        converter = CONVERTERS.get(det.format)()
        det.options = tuple(converter.options)
        for row in mapping_rows(converter, found.index):
            note = "NOT MAPPED: the conversion will refuse" if row.note == UNMAPPED else \
                f"dropped: {row.note}" if row.target is None else row.note
            det.mapping.append(_row(row.source, row.shape, row.dtype, row.target or "(dropped)", note))
        det.notes += list(converter.notes)
        return det
    for name, info in sorted(found.index.items()):
        canon = vr.canonical_name(name) if found.kind == SPECULATORS else name
        note = "vLLM ignores it" if canon is None else "renamed by vLLM on load" if canon != name else ""
        det.mapping.append(_row(name, info.shape, info.dtype, canon or "(not loaded by vLLM)", note))
    if found.kind == SPECULATORS and any(k.startswith("midlayer.") for k in found.index):
        det.notes.append("Uses the older `midlayer.*` names; vLLM and the workbench rename them to `layers.0.*`.")
    return det


def convertible(det: Detection) -> bool:
    """A source layout one of the engine's converters handles."""
    return det.kind == "convertible"


def dry_run(det: Detection, verifier: str | None, aux_layer_ids: str | None,
            mask_token_id: int | None = None) -> dict[str, Any]:
    """The engine's dry run (`convert --dry-run`): the resulting config and the problems; nothing written."""
    aux = [int(x) for x in aux_layer_ids.split(",") if x.strip()] if aux_layer_ids else None
    fmt = det.format if det.format != det.detected else None
    p = plan(det.folder, fmt=fmt, verifier=verifier, allow_pickle=False,
             options=ConvertOptions(aux_layer_ids=aux, mask_token_id=mask_token_id))
    return {"config": p.config, "problems": p.problems, "defaulted": p.defaulted}


def parse_token_id(text: str) -> int | None:
    """A token id typed on the page (None when left empty)."""
    text = text.strip()
    if not text:
        return None
    if not text.isdigit():
        raise WorkbenchError(f"'{text}' is not a token id", hint="give a non-negative integer, e.g. 151669")
    return int(text)


def _row(source: str, shape, dtype: str, target: str, note: str) -> dict[str, Any]:
    return {"source key": source, "shape": str(list(shape)), "dtype": dtype, "speculators key": target,
            "note": note}


def convert_argv(src: str, out: str, verifier: str | None, aux_layer_ids: str | None,
                 overwrite: bool = False, *, fmt: str | None = None, mask_token_id: int | None = None) -> list[str]:
    given = {"overwrite": overwrite or None, "format": fmt or None, "verifier": verifier or None,
             "aux_layer_ids": aux_layer_ids or None, "mask_token_id": mask_token_id}
    options = ConvertJob(**{k: v for k, v in given.items() if v is not None})
    return options.argv("convert", src, "--out", out)


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


def llamacpp_problem(draft: str) -> str | None:
    """Why llama.cpp cannot run this draft (its type's own reason), or None."""
    import engine.algos  # noqa: F401  (registers the draft types)

    cfg = read_config_dict(draft)
    return config_type(cfg.get("speculators_model_type")).llamacpp_problem(cfg)


def default_gguf(draft: str) -> str:
    """`<runs>/exports/<draft folder name>.gguf`: where an export goes unless the user says otherwise."""
    return str(runs_dir() / "exports" / f"{Path(draft).name}.gguf")


def export_argv(draft: str, out: str, draft_type: str, target_out: str | None, target_type: str | None) -> list[str]:
    """The `export --to gguf` command line of the tab's values."""
    given = {"draft": draft, "out": out, "draft_type": draft_type, "target_out": target_out or None,
             "target_type": target_type if target_out else None}
    options = ExportOptions(**{k: v for k, v in given.items() if v is not None})
    argv = options.argv("export")
    return [argv[0], options.draft, *[w for w in argv[1:] if w not in ("--draft", options.draft)]]
