"""User-facing error type: says what is wrong, where, and how to fix it (no traceback needed)."""

from __future__ import annotations

import errno
import json
import os


class WorkbenchError(Exception):
    """An error caused by user input or environment, with a hint on how to fix it."""

    def __init__(self, message: str, *, hint: str | None = None, where: str | None = None):
        self.message = message
        self.hint = hint
        self.where = where
        super().__init__(self.__str__())

    def __str__(self) -> str:
        parts = [f"{self.where}: {self.message}" if self.where else self.message]
        if self.hint:
            parts.append(f"Fix: {self.hint}")
        return "\n".join(parts)


# -- the shared translator: any exception -> what is wrong, where, how to fix ------------------------------------

_OS_ERRORS = {
    errno.ENOSPC: ("no space left on the disk", "free disk space, or write to a folder on a disk with room; "
                                                 "nothing half-written was kept"),
    errno.EDQUOT: ("disk quota exceeded", "free space in your quota, or write somewhere else"),
    errno.EROFS: ("the file system is read-only", "choose an output path on a writable disk"),
    errno.EISDIR: ("a folder was given where a file is expected", "give the path of a file, not of a folder"),
    errno.ENOTDIR: ("a file was given where a folder is expected", "give the path of a folder"),
    errno.ENOENT: ("no such file or folder", "check the path (and that the file was not moved or deleted)"),
    errno.EACCES: ("permission denied", "choose a path you can read and write, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a path you own, or fix its permissions"),
    errno.EEXIST: ("the path already exists", "choose another path, or remove the existing one first"),
    errno.ENAMETOOLONG: ("the path is too long", "choose a shorter path"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n) or use fewer data files"),
}

_PATH_LOCALS = ("path", "p", "filename", "file", "f", "folder", "src", "source", "out", "config", "dataset")


def _where_from_traceback(exc: BaseException) -> str | None:
    """The file (else folder) the innermost workbench frame was working on, when one of its locals names it."""
    tb, frames = exc.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    here = os.path.dirname(os.path.abspath(__file__))
    for frame in reversed(frames):
        if not os.path.abspath(frame.f_code.co_filename).startswith(here + os.sep):
            continue
        found = []
        for name in _PATH_LOCALS:
            value = frame.f_locals.get(name)
            if isinstance(value, (str, os.PathLike)):
                text = os.fspath(value)
                if isinstance(text, str) and text and len(text) < 4096 and os.path.exists(text):
                    found.append(text)
        files = [t for t in found if os.path.isfile(t)]
        if files or found:
            return (files or found)[0]
    return None


def validation_summary(exc) -> str:
    """A pydantic ValidationError as one line naming each bad field (the app shows the same text)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "value"
        lines.append(f"`{loc}`: {err['msg']}")
    return "invalid settings — " + "; ".join(lines)


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _failing_model_family(exc: BaseException) -> str | None:
    """The model family whose transformers modeling code raised `exc` (its innermost frame), or None."""
    tb, family = exc.__traceback__, None
    while tb is not None:
        parts = os.path.normpath(tb.tb_frame.f_code.co_filename).split(os.sep)
        if "transformers" in parts and len(parts) > 2 and parts[-3] == "models" \
                and parts[-1].startswith("modeling_"):
            family = parts[-2]
        elif family is not None and not {"torch", "transformers"} & set(parts):
            family = None  # the error came from deeper code of another package (or ours), not the model's own
        tb = tb.tb_next
    return family


def translate(exc: BaseException) -> WorkbenchError | None:
    """Our error for a foreign exception a user can act on (None: not one we know, likely a bug).

    Used by the CLI's last line of defence and by the app (ui/errors.py), so both say the same.
    """
    if isinstance(exc, WorkbenchError):
        return exc
    cls = type(exc)
    if cls.__name__ == "ValidationError" and cls.__module__.startswith("pydantic"):
        return WorkbenchError(validation_summary(exc), where=_where_from_traceback(exc),
                              hint="correct the fields named above")
    if cls.__name__ == "SafetensorError" or cls.__module__.startswith("safetensors"):
        return WorkbenchError(f"a .safetensors file cannot be read ({_first_line(exc)})",
                              where=_where_from_traceback(exc),
                              hint="the file is truncated, corrupt or not safetensors: re-save or re-download it")
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start:exc.start + 1].hex() if isinstance(exc.object, (bytes, bytearray)) else "?"
        return WorkbenchError(f"a file is not valid {exc.encoding.upper()} text (byte 0x{bad} at offset {exc.start}: "
                              f"{exc.reason})", where=_where_from_traceback(exc),
                              hint="save the file as UTF-8 text; a binary file cannot be read as text")
    if cls.__name__ == "UnpicklingError":
        detail = str(exc)
        marker = "WeightsUnpickler error:"
        reason = _first_line(detail.split(marker, 1)[1].split("Check the documentation", 1)[0]) \
            if marker in detail else _first_line(detail)
        if "Unsupported global" in detail:
            return WorkbenchError(f"refused to unpickle: the file holds Python objects, not only tensors ({reason})",
                                  where=_where_from_traceback(exc),
                                  hint="the workbench never runs code from a pickle: convert the weights to "
                                  "safetensors with a tool you trust, then use that file")
        return WorkbenchError(f"not a readable PyTorch weights file ({reason})", where=_where_from_traceback(exc),
                              hint="the file is corrupt or not a torch.save file: re-download it, or use safetensors")
    if isinstance(exc, RuntimeError) and str(exc).startswith("Error(s) in loading state_dict"):
        return WorkbenchError(f"the weights do not fit the model: {_first_line(str(exc).split(':', 1)[1], 400)}",
                              where=_where_from_traceback(exc),
                              hint="the weights were saved for another architecture or another config.json; "
                              "use the config they were trained with (`python -m engine validate` names mismatches)")
    if isinstance(exc, RuntimeError) and "PytorchStreamReader" in str(exc):
        return WorkbenchError(f"a PyTorch weights file is corrupt ({_first_line(exc)})",
                              where=_where_from_traceback(exc),
                              hint="re-download or re-save the file (safetensors preferred)")
    if isinstance(exc, OSError):
        what, hint = _OS_ERRORS.get(exc.errno, (exc.strerror or _first_line(exc) or cls.__name__,
                                                "check the path, the free disk space and the permissions"))
        where = exc.filename if exc.filename is not None else _where_from_traceback(exc)
        if exc.filename2 is not None:
            where = f"{where} -> {exc.filename2}"
        return WorkbenchError(what, where=os.fspath(where) if isinstance(where, os.PathLike) else where, hint=hint)
    family = _failing_model_family(exc)
    if family is not None and isinstance(exc, (RuntimeError, ValueError, IndexError, AttributeError, TypeError)):
        return WorkbenchError(f"transformers' {family} model fails on this target ({cls.__name__}: "
                              f"{_first_line(exc, 300)})",
                              hint=f"the target's config.json may hold values this transformers version's {family} "
                                   "code does not support (e.g. a head_dim that disagrees with the attention's own "
                                   "dimensions); the families the workbench verifies are listed in docs/families.md")
    if isinstance(exc, MemoryError):
        return WorkbenchError("out of memory", hint="use a smaller model, fewer tokens or a smaller batch")
    if isinstance(exc, json.JSONDecodeError):
        return WorkbenchError(f"invalid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                              where=_where_from_traceback(exc), hint="fix the JSON syntax at that position")
    return None
