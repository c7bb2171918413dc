"""GGUF files for llama.cpp: a draft exported by llama.cpp's own converter, and the target beside it, both cached."""

# A draft goes through the layout llama.cpp's converter reads (its algorithm's `write_llamacpp_form`, or the draft
# folder as it is), with `--target-model-dir` on the target's Hugging Face folder. The target is the built-in's own
# GGUF as shipped, or a folder converted at the precision asked for. Results are cached under the llama.cpp home,
# keyed by what they were made from, so a second export or serve costs nothing.

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import engine.algos  # noqa: F401  (registers the draft types and their llama.cpp forms)
from engine.errors import WorkbenchError
from engine.format.checkpoint import read_config_dict
from engine.format.config import config_type
from engine.fsutil import atomic_write_json, exclusive_lock, read_json, tensors_digest
from engine.llamacpp.build import LlamaCpp, ensure_llamacpp, llamacpp_home
from engine.targets.identity import target_for_draft
from engine.targets.resolve import BUILTIN_TARGETS, builtin_for, find_builtin_gguf, resolve_target

log = logging.getLogger(__name__)

OUT_TYPES = ("f32", "bf16", "f16", "q8_0")  # what llama.cpp's converter writes (its --outtype)
SHIPPED = "shipped"  # the built-in target's own GGUF file, as its package ships it
TARGET_TYPES = (*OUT_TYPES, SHIPPED)
DEFAULT_TARGET_TYPE = "f32"  # the weights the in-process engine decodes: acceptance compares like with like
DEFAULT_DRAFT_TYPE = "f32"
CACHE_GB_ENV = "WORKBENCH_LLAMACPP_CACHE_GB"  # the GGUF cache's limit (least recently used files go first)
DEFAULT_CACHE_GB = 8

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class DraftGguf:
    """A draft exported for llama.cpp: the file, the `--spec-type` that runs it, its default k, and its source."""

    path: Path
    spec_type: str
    k: int
    draft: Path
    target_dir: Path
    outtype: str


def spec_type_of(cfg: dict) -> str:
    """llama-server's `--spec-type` for a draft's config, or a WorkbenchError saying why llama.cpp cannot run it."""
    cls = config_type(cfg.get("speculators_model_type"))
    problem = cls.llamacpp_problem(cfg)
    if problem:
        raise WorkbenchError(f"llama.cpp cannot run this {cls.algorithm} draft: {problem}",
                             hint="serve it in-process or with vLLM (`python -m engine serve --engine vllm`)")
    return cls.llamacpp_spec_type


def draft_k(cfg: dict) -> int:
    """The draft's own speculative_tokens (its default proposal method's)."""
    info = cfg["speculators_config"]
    methods = {m.get("proposal_type"): m for m in info["proposal_methods"]}
    return int(methods.get(info.get("default_proposal_method"), info["proposal_methods"][0])["speculative_tokens"])


def export_draft(draft: str | os.PathLike, out: str | os.PathLike | None = None, *, target: str | None = None,
                 outtype: str = DEFAULT_DRAFT_TYPE, progress: Progress | None = None,
                 build: LlamaCpp | None = None) -> DraftGguf:
    """Convert a speculators draft to GGUF with llama.cpp's converter; cached, then copied to `out` if given."""
    draft_dir = Path(draft).expanduser().resolve()
    cfg = read_config_dict(draft_dir)
    spec_type = spec_type_of(cfg)
    _check_type(outtype, OUT_TYPES, "draft")
    if out is not None:
        check_out(out)
    target_dir = Path(resolve_target(target_for_draft(draft_dir, target) or target).path)
    if not (target_dir / "tokenizer.json").is_file() and not (target_dir / "tokenizer.model").is_file():
        raise WorkbenchError(f"the target folder {target_dir} has no tokenizer, which llama.cpp's converter copies "
                             "into the draft", hint="give --target a Hugging Face folder with its tokenizer files")
    build = build or ensure_llamacpp(progress)
    key = _digest({"draft": tensors_digest(sorted(draft_dir.glob("*.safetensors"))), "config": cfg,
                   "target": str(target_dir), "outtype": outtype, "llama.cpp": build.version})
    path = llamacpp_home() / "gguf" / f"{draft_dir.name}-{outtype}-{key}.gguf"
    with exclusive_lock(path.with_suffix(".lock")):
        if not path.is_file():
            _convert_draft(cfg, draft_dir, target_dir, outtype, path, build, progress)
    result = DraftGguf(used(path), spec_type, draft_k(cfg), draft_dir, target_dir, outtype)
    if out is not None:
        result = DraftGguf(copy_out(path, Path(out)), spec_type, result.k, draft_dir, target_dir, outtype)
    return result


def _convert_draft(cfg: dict, draft_dir: Path, target_dir: Path, outtype: str, final: Path, build: LlamaCpp,
                   progress: Progress | None) -> None:
    cls = config_type(cfg["speculators_model_type"])
    with tempfile.TemporaryDirectory(prefix="llamacpp-form-") as tmp:
        form = cls.write_llamacpp_form(cfg, draft_dir, Path(tmp) / "form") or draft_dir
        if progress:
            progress(f"converting {draft_dir.name} to GGUF ({outtype}) with llama.cpp's converter", 0.5)
        convert(build, form, final, outtype=outtype, target_dir=target_dir)


def target_gguf(target: str | None = None, *, outtype: str = DEFAULT_TARGET_TYPE, progress: Progress | None = None,
                build: LlamaCpp | None = None) -> Path:
    """The target's GGUF: a given .gguf file, the built-in's own file (`shipped`), or its folder converted (cached)."""
    _check_type(outtype, TARGET_TYPES, "target")
    if target and str(target).endswith(".gguf"):
        if not Path(target).is_file():
            raise WorkbenchError(f"{target} is not a file", hint="give the path of a .gguf file, or a target folder")
        return Path(target).resolve()
    builtin = builtin_for(target or next(iter(BUILTIN_TARGETS))) or builtin_for(_recorded_hub_id(target))
    if outtype == SHIPPED:
        if builtin is None:
            raise WorkbenchError(f"'{target}' ships no GGUF of its own", hint=f"choose one of {', '.join(OUT_TYPES)}, "
                                 "or give a .gguf file as the target")
        return find_builtin_gguf(builtin)
    folder = Path(resolve_target(target).path)
    build = build or ensure_llamacpp(progress)
    key = _digest({"target": str(folder), "files": _stamps(folder), "outtype": outtype, "llama.cpp": build.version})
    path = llamacpp_home() / "gguf" / f"{folder.name}-{outtype}-{key}.gguf"
    with exclusive_lock(path.with_suffix(".lock")):
        if not path.is_file():
            if progress:
                progress(f"converting the target {folder.name} to GGUF ({outtype}), once", 0.3)
            convert(build, folder, path, outtype=outtype)
    return used(path)


def _recorded_hub_id(target: str | None) -> str | None:
    """The hub id a prepared target folder records (the built-in's dequantized copy names its own)."""
    marker = Path(str(target)) / "workbench_target.json" if target else None
    try:
        return read_json(marker).get("hub_id") if marker and marker.is_file() else None
    except (OSError, ValueError):
        return None


def used(path: Path) -> Path:
    """A cached GGUF, marked as used now (the cache keeps the most recently used within CACHE_GB_ENV)."""
    os.utime(path)
    return path


MADE_BY = "convert_hf_to_gguf.py"  # the note beside every GGUF this cache wrote (`convert`)


def _written_here(path: Path) -> bool:
    """Whether a GGUF was written by this cache: its note says so (a file put there by hand has none)."""
    try:
        return read_json(path.with_suffix(".json")).get("made_by") == MADE_BY
    except (OSError, ValueError, AttributeError):
        return False


def prune_cache(folder: Path, keep: Path | None = None) -> None:
    """Remove the least recently used GGUFs this cache wrote (with their notes) while they hold more than its limit;
    any other file in the folder is left alone."""
    limit = float(os.environ.get(CACHE_GB_ENV) or DEFAULT_CACHE_GB) * 2**30
    files = sorted((p for p in folder.glob("*.gguf") if _written_here(p)), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in files)
    for path in files:
        if total <= limit:
            break
        if path == keep:
            continue
        total -= path.stat().st_size
        for extra in (path, path.with_suffix(".json"), path.with_suffix(".lock")):
            extra.unlink(missing_ok=True)
        log.info("removed %s from the GGUF cache (over %.0f GiB)", path.name, limit / 2**30)


def convert(build: LlamaCpp, model_dir: Path, out: Path, *, outtype: str, target_dir: Path | None = None) -> Path:
    """Run llama.cpp's `convert_hf_to_gguf.py` into a temporary file and move it to `out` when it succeeded."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    argv = [sys.executable, str(build.converter), str(model_dir), "--outtype", outtype, "--outfile", str(tmp)]
    if target_dir is not None:
        argv += ["--target-model-dir", str(target_dir)]
    log.info("$ %s", " ".join(argv))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=build.converter_env(), timeout=3600)
        if proc.returncode != 0 or not tmp.is_file():
            said = _converter_error(proc.stdout + proc.stderr)
            raise WorkbenchError(f"llama.cpp's converter refused {model_dir}: {said}",
                                 hint="the draft or target is in a layout llama.cpp does not read; "
                                      "`python -m engine validate` checks the draft")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    atomic_write_json(out.with_suffix(".json"), {"made_by": MADE_BY, "llama.cpp": build.version,
                                                 "source": str(model_dir), "outtype": outtype,
                                                 "target_dir": str(target_dir) if target_dir else None})
    prune_cache(out.parent, keep=out)
    return out


def _converter_error(text: str) -> str:
    """The converter's own reason: its last error or exception line, else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln.split(":", 1)[0] or "not supported" in ln]
    return (errors or lines or ["no output"])[-1][:600]


def check_out(out: str | os.PathLike) -> Path:
    """The path a GGUF may be written to: not a folder, and not a file other than a GGUF (left as it is)."""
    out = Path(out).expanduser().resolve()
    if out.is_dir():
        raise WorkbenchError(f"{out} is a folder", hint="give the path of the .gguf file to write")
    if out.exists():
        with open(out, "rb") as f:
            if f.read(4) != b"GGUF":
                raise WorkbenchError(f"{out} exists and is not a GGUF file; it is left as it is",
                                     hint="choose another --out path")
    return out


def copy_out(cached: Path, out: Path) -> Path:
    """Copy a cached GGUF to the user's path (atomically; an existing file there is replaced only if it is a GGUF)."""
    import shutil

    out = check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(cached, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _check_type(outtype: str, allowed: tuple[str, ...], what: str) -> None:
    if outtype not in allowed:
        raise WorkbenchError(f"unknown {what} GGUF type '{outtype}'", hint=f"choose one of {', '.join(allowed)}")


def _stamps(folder: Path) -> list[str]:
    return [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(folder.iterdir()) if p.is_file()]


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]
