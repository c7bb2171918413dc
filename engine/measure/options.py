"""The typed options of `bench` and `evaluate`: field descriptions are their CLI and form help."""

from __future__ import annotations

import argparse
from typing import Literal

from pydantic import Field, field_validator, model_validator

from engine.errors import WorkbenchError
from engine.generate.ngram import NGRAM_MIN_MATCH
from engine.generate.options import NGRAM_MIN_MATCH_HELP, P_MIN_HELP
from engine.generate.sampling import SamplingParams
from engine.llamacpp.gguf import DEFAULT_DRAFT_TYPE, DEFAULT_TARGET_TYPE, OUT_TYPES, TARGET_TYPES
from engine.options import Options
from engine.targets.dtypes import DECODE_DTYPE_HELP, DECODE_DTYPES

ALL_METHODS = ("baseline", "draft", "ngram", "hf_prompt_lookup", "hf_assisted", "draft_ngram")
DEFAULT_METHODS = ALL_METHODS[:5]  # draft_ngram (the n-gram where its match is long, else the draft) when asked
KS_METHODS = ("baseline", "draft", "ngram")  # what one speed per k (--ks) decodes
FORECAST_ENGINES = ("in-process", "llama.cpp")
BACKEND_METHODS = {"transformers": ALL_METHODS, "vllm": ("baseline", "draft", "ngram"),
                   "llama.cpp": ("baseline", "draft", "ngram", "draft_ngram")}
TARGET_HELP = ("target: built-in name, folder or hub id (default: the draft's verifier when it is available here, "
               "else the built-in); one of another shape than the draft's verifier is refused")
DRAFT_HELP = "draft folder (default: the shipped draft of a built-in target)"


class BenchOptions(Options):
    """`bench`: baseline and speculative methods on the same prompts."""

    target: str | None = Field(None, description=TARGET_HELP)
    draft: str | None = Field(None, description=DRAFT_HELP)
    prompts: str = Field("sharegpt", description="JSONL file ({'prompt': str} or {'messages': [...]} per line), a "
                         "built-in workload (sharegpt: chat, humaneval: code, general: everyday questions) or a "
                         "dataset (its held-out prompts)")
    num_prompts: int = Field(20, ge=1, description="prompts to use")
    max_prompt_chars: int = Field(1500, ge=1, description="skip built-in held-out prompts longer than this (keeps "
                                  "CPU runs short)")
    max_new_tokens: int = Field(128, ge=1, description="tokens generated per prompt")
    k: int = Field(3, ge=1, description="draft tokens per step")
    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling when temperature > 0")
    top_k: int = Field(0, ge=0, description="top-k sampling when temperature > 0 (0 = off)")
    seed: int = Field(0, description="seed of the prompt choice and of sampling")
    methods: str = Field(",".join(DEFAULT_METHODS), description=f"comma-separated subset of {','.join(ALL_METHODS)}; "
                         "a backend measures those it runs (" + "; ".join(f"{b}: {','.join(m)}" for b, m in
                                                                  BACKEND_METHODS.items()) + ")")
    assistant: str | None = Field(None, description="assistant model folder for hf_assisted")
    backend: Literal["transformers", "vllm", "llama.cpp"] = Field(
        "transformers", description="in-process engine, real vLLM through its OpenAI API and /metrics, or real "
        "llama.cpp (llama-server, built once) with the draft exported to GGUF")
    gguf_target: Literal[TARGET_TYPES] = Field(
        DEFAULT_TARGET_TYPE, description="llama.cpp backend: the target's GGUF (f32 = the weights the in-process "
        "engine decodes; shipped = the built-in's own quantized file)")
    gguf_draft: Literal[OUT_TYPES] = Field(DEFAULT_DRAFT_TYPE, description="llama.cpp backend: the draft's GGUF type")
    p_min: float | None = Field(None, ge=0, le=1, description=P_MIN_HELP)
    ngram_min_match: int = Field(NGRAM_MIN_MATCH, ge=2, le=5, description=NGRAM_MIN_MATCH_HELP + " (in-process)")
    dtype: Literal[DECODE_DTYPES] = Field(
        "auto", description="target dtype. vLLM backend: serving dtype, auto = bfloat16 (bf16 verification can flip "
        "near-ties; float32 is exact). In-process: " + DECODE_DTYPE_HELP.split(": ", 1)[1])
    threads: int | None = Field(None, ge=1, description="torch CPU threads")
    ks: str | None = Field(None, description="one speed per k: the draft at each of these k (1,2,3 or 1-5), n-gram at "
                           "--k and the baseline, interleaved prompt by prompt, in rounds repeated until every "
                           "speedup's 95% interval is within ±--tolerance (in-process only)")
    tolerance: float = Field(0.03, gt=0, description="with --ks: stop when every speedup's 95% interval is this "
                             "narrow (half-width, in ×)")
    budget_min: float = Field(20.0, gt=0, description="with --ks: stop before a round would pass this many minutes")
    max_rounds: int = Field(8, ge=1, description="with --ks: at most this many rounds")

    @field_validator("ks")
    @classmethod
    def _ks_readable(cls, value):
        if value is not None:
            try:
                ks = parse_ks(value)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(str(exc)) from None
            if not ks or min(ks) < 1:
                raise ValueError(f"'{value}': every k must be at least 1")
        return value

    @model_validator(mode="after")
    def _ks_methods(self):
        if not self.ks:
            return self
        if self.backend != "transformers":
            raise WorkbenchError("--ks measures in-process only", hint=f"drop --backend {self.backend}, or measure one "
                                 "k with --k")
        names = self.method_names()
        if "draft" not in names:
            raise WorkbenchError("--ks measures the draft at each k, and --methods leaves it out",
                                 hint="add draft to --methods")
        if other := [m for m in names if m not in KS_METHODS]:
            raise WorkbenchError(f"--ks measures {', '.join(KS_METHODS)} only, not {', '.join(other)}",
                                 hint="drop them from --methods, or measure them in a bench without --ks")
        return self

    def k_values(self) -> list[int]:
        """The k of `ks`, sorted, each once."""
        return sorted(set(parse_ks(self.ks))) if self.ks else [self.k]

    @field_validator("methods", mode="before")
    @classmethod
    def _methods_as_text(cls, value):
        return ",".join(value) if isinstance(value, (list, tuple)) else value

    def sampling(self):
        """The sampling parameters of every method (engine.generate.sampling)."""
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=self.top_k, seed=self.seed)

    def method_names(self) -> tuple[str, ...]:
        """The methods measured: --methods, or with --ks and no --methods, KS_METHODS."""
        if self.ks and "methods" not in self.model_fields_set:
            return KS_METHODS
        if self.backend == "llama.cpp" and "methods" not in self.model_fields_set:
            return BACKEND_METHODS["llama.cpp"]
        names = tuple(m.strip() for m in self.methods.split(",") if m.strip())
        bad = [m for m in names if m not in ALL_METHODS]
        if bad:
            raise WorkbenchError(f"unknown methods {bad}", hint=f"choose from {list(ALL_METHODS)}")
        if other := [m for m in names if m not in BACKEND_METHODS[self.backend]]:
            raise WorkbenchError(f"the {self.backend} backend does not run {', '.join(other)}",
                                 hint=f"it runs {', '.join(BACKEND_METHODS[self.backend])}; drop the others from "
                                      "--methods")
        return names


def parse_ks(text: str) -> list[int]:
    """k values as a user writes them: 1,2,3 or a range 1-5 (also 1..5)."""
    try:
        if "-" in text or ".." in text:
            lo, hi = text.replace("..", "-").split("-")
            return list(range(int(lo), int(hi) + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of k values (e.g. 1,2,3 or 1-5)") from None


class EvaluateOptions(Options):
    """`evaluate`: decoding-exact acceptance per k on held-out target outputs, without decoding."""

    draft: str | None = Field(None, description=DRAFT_HELP)
    target: str | None = Field(None, description=TARGET_HELP)
    data: str | None = Field(None, description="extracted hidden states of held-out target outputs (`extract` of a "
                             "regenerated val split); the fast path: no target forward at all; not with --dataset")
    dataset: str = Field("sharegpt", description="a dataset whose held-out (val) prompts the target answers once, "
                         "greedily")
    num_prompts: int = Field(20, ge=1, description="held-out prompts or samples to use")
    max_new_tokens: int = Field(128, ge=0, description="answer length, as `bench --max-new-tokens` (0 = the data's "
                                "whole answers)")
    k: list[int] | None = Field(None, description="k values, e.g. 1,2,3 or 1-5",
                                json_schema_extra={"parse": parse_ks, "shown_default": "1..max(5, the draft's k)"})
    max_prompt_chars: int = Field(1500, ge=1, description="skip longer held-out prompts (as bench)")
    seed: int = Field(0, description="seed of the prompt choice")
    temperature: float = Field(
        0.0, ge=0, description="also the expected acceptance of sampled decoding at this temperature (sum of "
        "min(p, q) per position along the greedy walk: an expectation, not a walk; online only)")
    forecast: bool = Field(False, description="measure the target's verify cost and the draft's cost per step here "
                           "and forecast the speedup")
    forecast_engines: list[str] = Field(
        ["in-process"], description="with --forecast: the engines to forecast for (llama.cpp: its step costs "
        "measured on llama-server, built once, beside the target's --gguf-target GGUF)")
    gguf_target: Literal[TARGET_TYPES] = Field(DEFAULT_TARGET_TYPE, description="llama.cpp forecast: the target's "
                                               "GGUF")
    dtype: Literal[DECODE_DTYPES] = Field("auto", description=DECODE_DTYPE_HELP)
    all_drafts: bool = Field(
        False, description="verify every drafted token: a proposer's own cut (fewer drafts when it is not "
        "confident) is not applied, so the table scores the draft's tokens alone, not what decoding would verify")
    walks: bool = Field(False, description="keep each sample's accepted-count sequence in the JSON")
    method: Literal["draft", "draft_ngram"] = Field("draft", description="the proposer walked: the draft, or "
                                                    "draft_ngram (the n-gram where its match is long, else the draft)")
    p_min: float | None = Field(None, ge=0, le=1, description=P_MIN_HELP)
    ngram_min_match: int = Field(NGRAM_MIN_MATCH, ge=2, le=5, description=NGRAM_MIN_MATCH_HELP)
    workloads: list[str] | None = Field(
        None, description="also these prompt sets, one row each of acceptance per k with its spread over prompts "
        "(--dataset's prompts are the first row): built-in workloads (sharegpt: chat, humaneval: code, general: "
        "everyday questions) or prompts files (JSONL, as bench --prompts); online only")

    @field_validator("forecast_engines")
    @classmethod
    def _known_engines(cls, value: list[str]) -> list[str]:
        if unknown := [e for e in value if e not in FORECAST_ENGINES]:
            raise ValueError(f"no forecast for {', '.join(unknown)}: choose from {', '.join(FORECAST_ENGINES)}")
        return value

    @field_validator("k", mode="before")
    @classmethod
    def _k_text(cls, value):
        return parse_ks(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_source(self):
        if self.data and "dataset" in self.model_fields_set:
            raise WorkbenchError("--data and --dataset both name the held-out samples", hint="give one of the two")
        if self.data and self.workloads:
            raise WorkbenchError("--workloads are prompt sets the target answers: not with --data",
                                 hint="drop --data (evaluate online), or drop --workloads")
        return self


class ParityOptions(Options):
    """`parity`: what a draft was trained on against how vLLM will serve it, each difference with its effect."""

    draft: str = Field(description="draft folder (a training run's draft/, or any draft with --run)")
    run: str | None = Field(None, description="the training run's --out folder (it holds config.yaml and draft/)",
                            json_schema_extra={"shown_default": "the folder above the draft, when it is one"})
    target: str | None = Field(None, description="the target vLLM will serve it beside",
                               json_schema_extra={"shown_default": "the draft's verifier"})
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="the dtype vLLM will run in "
                                                            "(`serve --dtype`)")
    max_model_len: int | None = Field(None, ge=1, description="vLLM's context length",
                                      json_schema_extra={"shown_default": "`serve`'s"})
