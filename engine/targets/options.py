"""The typed options of `targets`: field descriptions are its CLI help."""

from __future__ import annotations

from pydantic import Field

from engine.options import Options
from engine.targets.resolve import DEFAULT_TARGET


class TargetsOptions(Options):
    """`targets`: list the built-in targets, prepare one, show the kernel path decoding takes on this CPU."""

    prepare: str = Field(DEFAULT_TARGET, description="built-in target to dequantize and cache now ('none' to skip)")
    measure_kernels: bool = Field(False, description="time the exact kernel paths of the prepared target on this CPU "
                                  "now (else the first decoding load does, once) and show the timings",
                                  json_schema_extra={"store_true": True})
