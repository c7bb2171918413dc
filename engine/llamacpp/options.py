"""The typed options of `export` (a draft to GGUF for llama.cpp); field descriptions are the CLI and form help."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.llamacpp.gguf import DEFAULT_DRAFT_TYPE, DEFAULT_TARGET_TYPE, OUT_TYPES, TARGET_TYPES
from engine.options import Options


class ExportOptions(Options):
    """`export --to gguf DRAFT`: the draft as a GGUF file llama.cpp runs, made by llama.cpp's own converter."""

    draft: str = Field(..., description="draft folder (speculators format)")
    to: Literal["gguf"] = Field("gguf", description="the format to export to")
    out: str | None = Field(None, description="the .gguf file to write",
                            json_schema_extra={"shown_default": "<draft folder name>-<draft type>.gguf here"})
    target: str | None = Field(None, description="the target whose tokenizer (and embeddings) the draft takes: "
                               "built-in name or Hugging Face folder", json_schema_extra={
                                   "shown_default": "the draft's verifier"})
    draft_type: Literal[OUT_TYPES] = Field(DEFAULT_DRAFT_TYPE, description="the draft's GGUF tensor type")
    target_out: str | None = Field(None, description="also write the target's GGUF to this file (what llama-server's "
                                   "-m takes)")
    target_type: Literal[TARGET_TYPES] = Field(DEFAULT_TARGET_TYPE, description="with --target-out: the target's "
                                               "GGUF type (shipped = the built-in's own quantized file)")
    check: bool = Field(True, description="load the result in llama-server beside the target and draft a few "
                        "tokens")

    def default_out(self) -> str:
        from pathlib import Path

        return f"{Path(self.draft).resolve().name}-{self.draft_type}.gguf"
