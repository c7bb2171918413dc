"""Checks of hidden-state sample files: cheap ones from headers and token ids, full ones over every value and digest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.data.store.files import SAMPLE_DIGEST, load_sample, read_manifest, sample_indices, sample_path
from engine.errors import WorkbenchError
from engine.fsutil import safetensors_header, tensors_digest

FLOAT_DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}
INT_DTYPES = ("I64", "I32", "I16", "I8", "U8")


@dataclass(frozen=True)
class SampleProblem:
    """Why one sample file cannot be trained on."""

    path: Path
    what: str
    tokens: int = 0  # tokens the file holds (what skipping it costs), when its header says

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


@dataclass(frozen=True)
class Expected:
    """What the folder's manifest says every sample holds (None: not recorded, not checked)."""

    num_layers: int | None = None  # L of hidden_states [T, L, H]
    hidden_size: int | None = None
    vocab_size: int | None = None
    dtype: str | None = None  # bf16 / fp16 / fp32

    @classmethod
    def from_manifest(cls, manifest: dict) -> Expected:
        ids = manifest.get("layer_ids")
        return cls(len(ids) if isinstance(ids, list) else None, manifest.get("hidden_size"),
                   manifest.get("vocab_size"), manifest.get("dtype"))


def header_check(path: Path, expected: Expected) -> tuple[int, dict[str, str] | None, str | None]:
    """(tokens T, the file's metadata, problem or None) from the header alone: keys, dtypes, shapes [T, L, H]/[T]."""
    try:
        header, _ = safetensors_header(path)
    except WorkbenchError as exc:
        return 0, None, exc.message.removeprefix(f"{path} ")
    except OSError as exc:
        return 0, None, f"cannot be read ({exc.strerror or exc})"
    entries = {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    meta = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else None
    hs, ids, mask = entries.get("hidden_states"), entries.get("token_ids"), entries.get("loss_mask")
    if hs is None or ids is None:
        return 0, meta, f"is not a hidden-states sample (tensors {sorted(entries)}; needs hidden_states and token_ids)"
    shape, ids_shape = list(hs.get("shape") or []), list(ids.get("shape") or [])
    t = int(ids_shape[0]) if len(ids_shape) == 1 else 0
    problems = []
    if hs.get("dtype") not in FLOAT_DTYPES:
        problems.append(f"hidden_states has dtype {hs.get('dtype')} (expected one of {', '.join(FLOAT_DTYPES)})")
    elif expected.dtype and FLOAT_DTYPES[hs["dtype"]] != expected.dtype:
        problems.append(f"hidden_states is {FLOAT_DTYPES[hs['dtype']]}, the manifest says {expected.dtype}")
    if ids.get("dtype") not in INT_DTYPES or len(ids_shape) != 1:
        problems.append(f"token_ids is {ids.get('dtype')} {ids_shape} (expected integers [T])")
    if mask is not None and (mask.get("dtype") not in (*INT_DTYPES, "BOOL") or list(mask.get("shape") or []) != [t]):
        problems.append(f"loss_mask is {mask.get('dtype')} {mask.get('shape')} (expected integers [{t}])")
    if len(shape) != 3 or shape[0] != t:
        problems.append(f"hidden_states has shape {shape} (expected [T={t}, L, H])")
    else:
        if expected.num_layers is not None and shape[1] != expected.num_layers:
            problems.append(f"hidden_states holds {shape[1]} layers, the manifest records {expected.num_layers}")
        if expected.hidden_size is not None and shape[2] != expected.hidden_size:
            problems.append(f"hidden_states has width {shape[2]}, the manifest records {expected.hidden_size}")
    if not problems and t == 0:
        problems.append("holds no tokens")
    return t, meta, "; ".join(problems) or None


def token_problem(token_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int | None) -> str | None:
    """Token ids outside [0, vocab_size) or a loss mask other than 0/1, with the first position."""
    if vocab_size:
        bad = ((token_ids < 0) | (token_ids >= vocab_size)).nonzero()
        if bad.numel():
            pos = int(bad[0, 0])
            return (f"token id {int(token_ids[pos])} at position {pos} is outside the vocabulary of {vocab_size} "
                    f"tokens ({bad.shape[0]} such ids)")
    bad = ((loss_mask != 0) & (loss_mask != 1)).nonzero()
    if bad.numel():
        pos = int(bad[0, 0])
        return f"loss_mask holds {int(loss_mask[pos])} at position {pos} (expected 0 or 1)"
    return None


def value_problem(hidden_states: torch.Tensor) -> str | None:
    """Non-finite hidden states [T, L, H], with the first (position, layer column)."""
    finite = torch.isfinite(hidden_states)
    if bool(finite.all()):
        return None
    t, col, h = (int(x) for x in (~finite).nonzero()[0])
    first = float(hidden_states[t, col, h])
    return f"hidden_states holds {int((~finite).sum())} non-finite values (the first, {first}, at position {t}, " \
           f"layer column {col})"


def sample_problem(sample: dict[str, torch.Tensor], vocab_size: int | None) -> str | None:
    """What is wrong with a loaded sample's values (token ids, loss mask, finiteness), or None."""
    return token_problem(sample["token_ids"], sample["loss_mask"], vocab_size) or value_problem(sample["hidden_states"])


def quick_check(path: Path, expected: Expected) -> tuple[int, SampleProblem | None]:
    """(tokens, problem) from the header and the token ids and loss mask (the hidden states are not read)."""
    from safetensors import safe_open

    t, _, problem = header_check(path, expected)
    if problem:
        return t, SampleProblem(path, problem, t)
    try:
        with safe_open(str(path), framework="pt") as f:
            ids = f.get_tensor("token_ids").long()
            mask = f.get_tensor("loss_mask").long() if "loss_mask" in f.keys() else torch.ones_like(ids)
    except Exception as exc:  # noqa: BLE001 - any unreadable tensor is the same problem for the user
        return t, SampleProblem(path, f"cannot be read ({exc})", t)
    problem = token_problem(ids, mask, expected.vocab_size)
    return t, SampleProblem(path, problem, t) if problem else None


def full_check(path: Path, expected: Expected) -> SampleProblem | None:
    """Every check: header, the content digest the file records (when it records one), token ids and all values."""
    t, meta, problem = header_check(path, expected)
    if problem:
        return SampleProblem(path, problem, t)
    try:
        recorded = (meta or {}).get(SAMPLE_DIGEST)
        if recorded and tensors_digest([path]) != recorded:
            return SampleProblem(path, "its tensors do not match the digest recorded when it was written (the "
                                       "file changed or is corrupt)", t)
        sample = load_sample(path)
    except WorkbenchError as exc:
        return SampleProblem(path, exc.message, t)
    except Exception as exc:  # noqa: BLE001 - an unreadable file is named, not a crash
        return SampleProblem(path, f"cannot be read ({type(exc).__name__}: {exc})", t)
    problem = sample_problem(sample, expected.vocab_size)
    return SampleProblem(path, problem, t) if problem else None


def refusal(problems: list[SampleProblem], total: int, *, hint: str | None = None) -> WorkbenchError:
    """One error naming the bad files (the first five) and the ways out (`hint`: other ways than training's)."""
    shown = "; ".join(str(p) for p in problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return WorkbenchError(f"{len(problems)} of {total} hidden-state files fail the checks: {shown}{more}",
                          hint=hint or "re-run the extraction into a new folder, remove those files, or pass "
                                       "--bad-samples skip to leave them out (the skipped tokens are reported)")


def check_folder(folder: str | Path, *, full: bool = False, progress: Iterable | None = None) -> dict:
    """Check every sample of an extraction folder; {"files", "tokens", "bad": [{"file", "problem", "tokens"}]}."""
    folder = Path(folder)
    indices = sample_indices(folder)
    if not indices:
        raise WorkbenchError(f"{folder} holds no hs_*.safetensors samples",
                             hint="give the --out folder of `python -m engine extract`")
    expected = Expected.from_manifest(read_manifest(folder) or {})
    bad, tokens = [], 0
    for i in progress(indices) if progress else indices:
        path = sample_path(folder, i)
        if full:
            t = header_check(path, expected)[0]
            problem = full_check(path, expected)
        else:
            t, problem = quick_check(path, expected)
        tokens += t
        if problem:
            bad.append({"file": str(path), "problem": problem.what, "tokens": problem.tokens})
    return {"folder": str(folder), "files": len(indices), "tokens": tokens, "full": full, "bad": bad,
            "bad_tokens": sum(b["tokens"] for b in bad)}
