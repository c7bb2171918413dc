"""The equivalent `python -m engine ...` command that every page shows (the CLI mirrors the app)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import streamlit as st

from engine.options import flag_words


def command(argv: Sequence[str]) -> str:
    return "python -m engine " + shlex.join([str(a) for a in argv])


def flags(values: dict[str, Any], defaults: dict[str, Any] | None = None) -> list[str]:
    """`--name value` for every value that is set and differs from its default (bools as --x / --no-x)."""
    out: list[str] = []
    defaults = defaults or {}
    for name, value in values.items():
        if value is None or (name in defaults and defaults[name] == value):
            continue
        out += flag_words(name, value)
    return out


def show_cli(argv: Sequence[str] | str, *, label: str = "Equivalent CLI command", expanded: bool = False) -> None:
    """An expander with the command line (st.code has a copy button)."""
    text = argv if isinstance(argv, str) else command(argv)
    with st.expander(label, expanded=expanded, icon=":material/terminal:"):
        st.code(text, language="bash", wrap_lines=True)
