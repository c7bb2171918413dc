"""DFlash2 (experimental): a speculators type the workbench validates and vLLM serves, but does not train or draft
in-process, so it registers only its config type (no `DraftAlgorithm`)."""

from engine.algos.dflash2 import config  # noqa: F401  (registration)
