"""The drafts shipped under assets/drafts/, and the default one for each built-in target."""

from __future__ import annotations

from pathlib import Path

from engine.fsutil import read_json
from engine.targets.resolve import DEFAULT_TARGET, builtin_for

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafts"
DEFAULTS_FILE = ASSETS / "defaults.json"  # {built-in target name: shipped draft folder} when several ship


def shipped_drafts(target_name: str | None) -> list[Path]:
    """Draft folders under assets/drafts/ whose verifier is this built-in target, the default first."""
    builtin = builtin_for(target_name or DEFAULT_TARGET)
    if builtin is None or not ASSETS.is_dir():
        return []
    found = []
    for folder in sorted(p for p in ASSETS.iterdir() if (p / "config.json").is_file()):
        try:
            verifier = (read_json(folder / "config.json").get("speculators_config") or {}).get("verifier") or {}
        except (OSError, ValueError):
            continue
        if builtin_for(verifier.get("name_or_path")) == builtin:
            found.append(folder)
    try:
        preferred = read_json(DEFAULTS_FILE).get(builtin.name) if DEFAULTS_FILE.is_file() else None
    except (OSError, ValueError):
        preferred = None
    return sorted(found, key=lambda p: p.name != preferred)


def default_draft(target_name: str | None) -> Path | None:
    """The shipped draft for a built-in target, if one exists."""
    drafts = shipped_drafts(target_name)
    return drafts[0] if drafts else None
