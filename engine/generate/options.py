"""The typed options of `generate`: field descriptions are its CLI help; the app builds its commands from it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.generate.ngram import NGRAM_MIN_MATCH
from engine.options import Options
from engine.targets.dtypes import DECODE_DTYPE_HELP, DECODE_DTYPES

METHODS = ("baseline", "draft", "ngram", "draft_ngram")  # what `generate --method` takes (bench adds its own)
P_MIN_HELP = ("stop a draft chain before a token whose draft probability is below this (chain drafts; llama.cpp's "
              "--spec-draft-p-min)")
NGRAM_MIN_MATCH_HELP = ("draft_ngram: take the n-gram's proposal when its matched suffix has at least this many "
                        "tokens, else the draft's")


class GenerateOptions(Options):
    """`generate`: one prompt through the target, with or without speculative decoding."""

    target: str | None = Field(None, description="target: built-in name, folder or hub id (default: the draft's "
                               "verifier when it is available here, else the built-in); one of another shape than "
                               "the draft's verifier is refused")
    method: Literal[METHODS] = Field("draft", description="baseline = the target alone; draft = speculative "
                                     "decoding with --draft; ngram = prompt lookup; draft_ngram = the n-gram where "
                                     "its match is long, else the draft")
    draft: str | None = Field(None, description="draft folder (default: the shipped draft of a built-in target)")
    k: int = Field(3, ge=1, description="draft tokens per step")
    p_min: float | None = Field(None, ge=0, le=1, description=P_MIN_HELP)
    ngram_min_match: int = Field(NGRAM_MIN_MATCH, ge=2, le=5, description=NGRAM_MIN_MATCH_HELP)
    max_new_tokens: int = Field(128, ge=1, description="tokens to generate")
    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling when temperature > 0")
    top_k: int = Field(0, ge=0, description="top-k sampling when temperature > 0 (0 = off)")
    seed: int = Field(0, description="seed of sampling")
    dtype: Literal[DECODE_DTYPES] = Field("auto", description=DECODE_DTYPE_HELP)
    events: bool = Field(False, description="print one JSON event per step instead of text",
                         json_schema_extra={"store_true": True})
