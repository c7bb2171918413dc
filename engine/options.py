"""The base of every verb's typed options: unknown fields refused, values checked, paths taken as text."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class Options(BaseModel):
    """Base of the verbs' options: unknown fields are refused, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _paths_as_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value
