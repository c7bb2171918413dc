"""Converters of published draft checkpoints into the speculators format: one module per source layout (each with an
explicit key-mapping table), registered by name, plus the layouts that cannot be converted and why."""

from __future__ import annotations

from engine.convert import (
    dflash2_zlab,  # noqa: F401
    dflash_zlab,  # noqa: F401
    dspark_deepspec,  # noqa: F401
    eagle3_modelopt,  # noqa: F401  (registration; detection order: Converter.precedence)
    eagle3_qwen3,  # noqa: F401
    eagle3_safeailab,  # noqa: F401
    eagle3_specforge,  # noqa: F401
    not_convertible,  # noqa: F401  (registration: checked before the converters)
    peagle_aws,  # noqa: F401
    peagle_specforge,  # noqa: F401
)
from engine.convert.base import (
    CONVERTERS,
    NOT_CONVERTIBLE,
    Converter,
    ConvertJob,
    ConvertOptions,
    KeyRule,
    MappingRow,
)
from engine.convert.pipeline import (
    SPECULATORS,
    UNKNOWN,
    Detection,
    Plan,
    Verdict,
    convert,
    detect,
    detect_source,
    mapping_rows,
    mapping_table,
    plan,
    verify,
)

__all__ = ["CONVERTERS", "NOT_CONVERTIBLE", "SPECULATORS", "UNKNOWN", "ConvertJob", "ConvertOptions", "Converter",
           "Detection", "KeyRule", "MappingRow", "Plan", "Verdict", "convert", "detect", "detect_source",
           "mapping_rows", "mapping_table", "plan", "verify"]
