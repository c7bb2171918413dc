"""Engine errors shown as clear messages with what to do, never as a Python traceback."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import streamlit as st
from pydantic import ValidationError

from engine.errors import WorkbenchError, translate, validation_summary

log = logging.getLogger("workbench.ui")
PENDING = "app_pending_errors"  # errors raised in widget callbacks, shown on the next run


def describe(exc: BaseException) -> tuple[str, str | None]:
    """(what went wrong, what to do) for any exception, in words a user can act on."""
    if isinstance(exc, WorkbenchError):
        return (f"{exc.where}: {exc.message}" if exc.where else exc.message), exc.hint
    if isinstance(exc, ValidationError):
        return validation_summary(exc), "correct the fields named above"
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename or exc}", "check the path (it is read on the machine that runs the app)"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or exc}", "choose a folder you can write to"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), \
            "check the path, the free disk space and the file permissions"
    if isinstance(exc, MemoryError):
        return "out of memory", "use a smaller model, fewer tokens or a smaller batch"
    translated = translate(exc)  # the CLI's translator: safetensors, unpickling, decoding, state-dict errors
    if translated is not None:
        return describe(translated)
    if isinstance(exc, (KeyError, ValueError, TypeError)) and str(exc):
        return f"{type(exc).__name__}: {exc}", "check the inputs on this page; the terminal running the app has details"
    return f"{type(exc).__name__}: {exc}", ("this looks like a bug in the workbench: the full traceback is in "
                                            "the terminal running the app; the CLI command on this page reproduces it")


def show_error(exc: BaseException, what: str | None = None) -> None:
    """One red box with the problem and, when known, a blue box with what to do."""
    message, hint = describe(exc)
    if not isinstance(exc, (WorkbenchError, ValidationError)):
        log.error("%s failed", what or "an action", exc_info=exc)
    st.error(f"**{what} failed:** {message}" if what else message, icon=":material/error:")
    if hint:
        st.info(f"**What to do:** {hint}", icon=":material/lightbulb:")


@contextlib.contextmanager
def guard(what: str | None = None) -> Iterator[None]:
    """Run a block; an exception becomes a message on the page and the rest of the page still renders.

    Streamlit's own control flow (st.rerun, st.stop) derives from BaseException and passes through.
    """
    try:
        yield
    except Exception as exc:
        show_error(exc, what)


def guarded(what: str | None = None) -> Callable:
    """Decorator form of `guard` (for fragments and helpers that draw on the page)."""

    def wrap(func: Callable) -> Callable:
        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with guard(what):
                return func(*args, **kwargs)
            return None

        return inner

    return wrap


def callback(what: str, func: Callable, *args: Any, **kwargs: Any) -> Callable[[], None]:
    """A widget callback whose errors are kept and shown at the top of the next run (callbacks cannot draw)."""

    def run() -> None:
        try:
            func(*args, **kwargs)
        except Exception as exc:
            message, hint = describe(exc)
            if not isinstance(exc, (WorkbenchError, ValidationError)):
                log.error("%s failed", what, exc_info=exc)
            st.session_state.setdefault(PENDING, []).append((what, message, hint))

    return run


def show_pending() -> None:
    """Errors that widget callbacks raised since the last run."""
    for what, message, hint in st.session_state.pop(PENDING, []):
        st.error(f"**{what} failed:** {message}", icon=":material/error:")
        if hint:
            st.info(f"**What to do:** {hint}", icon=":material/lightbulb:")
