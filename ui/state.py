"""Session state shared by the pages: the active target and draft (keys `app_*`); pages use their own prefixes.

The choices in `Settings` survive a browser reload and an app restart: they are saved in a small JSON file under the
workbench home (written atomically) whenever a session changes one, and a new session starts from them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import streamlit as st
from pydantic import BaseModel, Field, ValidationError

from engine.algos.shipped import default_draft
from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_json, read_json, workbench_home
from engine.generate.ngram import NGRAM_MIN_MATCH
from engine.targets.identity import draft_verifier, same_target, target_for_draft
from engine.targets.resolve import DEFAULT_TARGET, resolves_locally

log = logging.getLogger(__name__)

TARGET = "app_target"  # built-in name, local folder or hub id
DRAFT = "app_draft"    # "auto" (the shipped draft of the target, if any), "none", or a draft folder
AUTO, NONE = "auto", "none"
SAVED = "app_saved_settings"  # the settings as this session last read or wrote them
SETTINGS_ENV = "WORKBENCH_SETTINGS"


class Settings(BaseModel):
    """What a user chose that the next session starts from; the field names are the session-state keys."""

    app_target: str = Field(DEFAULT_TARGET, description="The active target.")
    app_draft: str = Field(AUTO, description="The active draft: auto (the target's shipped draft), none, or a folder.")
    chat_k: int = Field(3, ge=1, le=8, description="Demo chat: tokens drafted per step.")
    chat_temperature: float = Field(0.0, ge=0.0, le=1.5, description="Demo chat: sampling temperature.")
    chat_max_new_tokens: int = Field(96, ge=8, le=1024, description="Demo chat: longest answer.")
    chat_seed: int = Field(0, ge=0, le=2**31 - 1, description="Demo chat: sampling seed.")
    chat_p_min: float = Field(0.0, ge=0.0, le=1.0, description="Demo chat: the draft's confidence cut (0 = off).")
    chat_ngram_min_match: int = Field(NGRAM_MIN_MATCH, ge=2, le=5,
                                      description="Demo chat: draft + n-gram's shortest n-gram match.")


DEFAULTS = Settings().model_dump()


def settings_path() -> Path:
    """$WORKBENCH_SETTINGS, or app-settings.json under the workbench home."""
    return Path(os.environ.get(SETTINGS_ENV) or workbench_home() / "app-settings.json")


def settings_file_is_ours(path: Path) -> bool:
    """True when `path` is absent or holds only what `save_state` writes (a JSON object of our settings' keys): a
    file of the user's named by $WORKBENCH_SETTINGS is never replaced or removed."""
    try:
        raw = read_json(path)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and set(raw) <= set(DEFAULTS)


def _gone(folder: str) -> bool:
    return Path(folder).is_absolute() and not Path(folder).exists()


def load_settings() -> dict[str, Any]:
    """The saved settings; a value that no longer validates (or a folder that is gone) falls back to its default."""
    try:
        raw = read_json(settings_path())
    except FileNotFoundError:
        raw = {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s (%s): the defaults apply", settings_path(), exc)
        raw = {}
    out = dict(DEFAULTS)
    for key, value in (raw if isinstance(raw, dict) else {}).items():
        if key not in DEFAULTS:
            continue
        try:
            out[key] = getattr(Settings.model_validate({key: value}), key)
        except ValidationError:
            log.warning("ignoring the saved %s=%r: the default applies", key, value)
    if _gone(out[TARGET]):
        out[TARGET] = DEFAULTS[TARGET]
    if out[DRAFT] not in (AUTO, NONE) and _gone(out[DRAFT]):
        out[DRAFT] = DEFAULTS[DRAFT]
    return out


def init_state() -> None:
    """At a session's first run: the saved settings; later runs put back a setting whose widget was on another page
    (Streamlit forgets a widget's value when its page is not shown)."""
    ss = st.session_state
    if SAVED not in ss:
        ss[SAVED] = load_settings()
    for key, value in ss[SAVED].items():
        ss.setdefault(key, value)


def save_state() -> None:
    """Write the settings this session changed since it last read or wrote them (the others stay as saved, perhaps
    by another session)."""
    ss = st.session_state
    saved = ss.get(SAVED)
    if saved is None:
        return
    changed = {k: ss[k] for k in DEFAULTS if k in ss and ss[k] != saved.get(k)}
    if not changed:
        return
    if not settings_file_is_ours(settings_path()):
        log.warning("not saving the app settings: %s holds other data", settings_path())
        return
    try:
        on_disk = load_settings() if settings_path().exists() else dict(DEFAULTS)
        merged = Settings.model_validate(on_disk | changed).model_dump()
        atomic_write_json(settings_path(), merged)
    except (OSError, ValidationError) as exc:  # not saved: the session goes on with its own values
        log.warning("could not save the app settings to %s: %s", settings_path(), exc)
        return
    ss[SAVED] = merged


def reset_settings() -> None:
    """Forget the saved settings: the defaults, in this session and the next ones (a button's on_click)."""
    try:
        if settings_file_is_ours(settings_path()):
            settings_path().unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", settings_path(), exc)
    ss = st.session_state
    ss[SAVED] = dict(DEFAULTS)
    for key, value in DEFAULTS.items():
        ss[key] = value


def active_target() -> str:
    return st.session_state.get(TARGET) or DEFAULT_TARGET


def draft_choice() -> str:
    return st.session_state.get(DRAFT) or AUTO


def active_draft() -> str | None:
    """The draft folder in use: the chosen one, the shipped default for the target (auto), or None."""
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
    st.session_state[DRAFT] = str(choice) if choice else NONE
    verifier = draft_verifier(choice) if choice and choice not in (AUTO, NONE) else None
    if verifier and resolves_locally(verifier) and not same_target(verifier, active_target()):
        st.session_state[TARGET] = verifier


def follow_note(choice: str | None) -> str | None:
    """What choosing a draft does to the active target, when the draft was trained for another one."""
    verifier = draft_verifier(choice) if choice and choice not in (AUTO, NONE) else None
    if not verifier or same_target(verifier, active_target()):
        return None
    if resolves_locally(verifier):
        return f"This draft was trained for `{verifier}`: using it makes that the active target."
    return (f"This draft was trained for `{verifier}`, which is not available here: it runs with the active target "
            "only if that has the same shape.")


def draft_target_problem(draft: str | None) -> str | None:
    """Why the active target cannot decode `draft` (another shape than the draft's verifier), or None."""
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
