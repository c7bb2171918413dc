"""A tiny name -> object registry (algorithms, proposers, converters), filled by explicit imports."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from engine.errors import WorkbenchError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self._items[name] = obj
            return obj
        return deco

    def unregister(self, name: str) -> None:
        """Remove an entry (tests that register temporary plugins clean up with it)."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise WorkbenchError(f"unknown {self.kind} '{name}'", hint=f"choose one of {self.names()}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
