"""The base of every verb's typed options: unknown fields refused, values checked, paths taken as text."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


def flag_words(name: str, value: Any, flag: str | None = None, *, store_true: bool = False) -> list[str]:
    """The command-line words of one option: `--name value`, a list comma-joined, a bool as `--name` / `--no-name`
    (a store_true flag only when set)."""
    flag = flag or "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else [] if store_true else ["--no-" + name.replace("_", "-")]
    if isinstance(value, (list, tuple)):
        return [flag, ",".join(str(v) for v in value)]
    return [flag, str(value)]


class Options(BaseModel):
    """Base of the verbs' options: unknown fields are refused, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _paths_as_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    def argv(self, verb: str, *positional: str) -> list[str]:
        """`python -m engine VERB` arguments for the fields given (not those left to their defaults), as the flags
        generated from this model spell them (engine.commands.flags): the app builds its commands with it."""
        out = [verb, *positional]
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name not in self.model_fields_set or value is None:
                continue
            extra = type(self).model_fields[name].json_schema_extra
            extra = extra if isinstance(extra, dict) else {}
            out += flag_words(name, value, extra.get("flags", (None,))[0], store_true=bool(extra.get("store_true")))
        return out
