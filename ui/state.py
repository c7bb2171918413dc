"""Session state shared by the pages: the active target and draft (keys `app_*`); pages use their own prefixes."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from engine.targets import DEFAULT_TARGET

TARGET = "app_target"  # built-in name, local folder or hub id
DRAFT = "app_draft"    # "auto" (the shipped draft of the target, if any), "none", or a draft folder
AUTO, NONE = "auto", "none"

DEFAULTS = {TARGET: DEFAULT_TARGET, DRAFT: AUTO}


def init_state() -> None:
    """Set the shared defaults once per session (a browser refresh starts a new session: defaults again)."""
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)


def active_target() -> str:
    return st.session_state.get(TARGET) or DEFAULT_TARGET


def draft_choice() -> str:
    return st.session_state.get(DRAFT) or AUTO


def active_draft() -> str | None:
    """The draft folder in use: the chosen one, the shipped default for the target (auto), or None."""
    from engine.generate.api import default_draft

    choice = draft_choice()
    if choice == NONE:
        return None
    if choice == AUTO:
        shipped = default_draft(active_target())
        return str(shipped) if shipped else None
    return choice


def set_target(name: str) -> None:
    st.session_state[TARGET] = name.strip()


def set_draft(choice: str | Path | None) -> None:
    """Make a draft active; a draft folder whose verifier can be loaded here makes that verifier the active target
    (the target follows the draft it was trained for)."""
    from engine.targets import draft_verifier, resolves_locally, same_target

    st.session_state[DRAFT] = str(choice) if choice else NONE
    verifier = draft_verifier(choice) if choice and choice not in (AUTO, NONE) else None
    if verifier and resolves_locally(verifier) and not same_target(verifier, active_target()):
        st.session_state[TARGET] = verifier


def follow_note(choice: str | None) -> str | None:
    """What choosing a draft does to the active target, when the draft was trained for another one."""
    from engine.targets import draft_verifier, resolves_locally, same_target

    verifier = draft_verifier(choice) if choice and choice not in (AUTO, NONE) else None
    if not verifier or same_target(verifier, active_target()):
        return None
    if resolves_locally(verifier):
        return f"This draft was trained for `{verifier}`: using it makes that the active target."
    return (f"This draft was trained for `{verifier}`, which is not available here: it runs with the active target "
            "only if that has the same shape.")


def draft_target_problem(draft: str | None) -> str | None:
    """Why the active target cannot decode `draft` (another shape than the draft's verifier), or None."""
    from engine.errors import WorkbenchError
    from engine.targets import target_for_draft

    if not draft:
        return None
    try:
        target_for_draft(draft, active_target())
    except WorkbenchError as exc:
        return str(exc)
    return None


def short(path_or_name: str | None, width: int = 38) -> str:
    """A label that fits the sidebar: the last path parts of a folder, or the name."""
    if not path_or_name:
        return "none"
    text = str(path_or_name)
    if "/" in text and Path(text).exists():
        parts = Path(text).parts
        text = "/".join(parts[-2:])
    return text if len(text) <= width else "…" + text[-(width - 1):]
