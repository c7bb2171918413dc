"""User-facing error type: says what is wrong, where, and how to fix it (no traceback needed)."""

from __future__ import annotations


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
