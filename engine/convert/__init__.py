"""Converters of research checkpoints into the speculators format, one module per source format, registered by name."""

from __future__ import annotations

from engine.convert.base import CONVERTERS, Converter, detect, mapping_table
from engine.convert import dflash_zlab, eagle3_research  # noqa: F401  (registration)

__all__ = ["CONVERTERS", "Converter", "detect", "mapping_table"]
