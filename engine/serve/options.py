"""The typed options of `serve`: the server's settings and what it serves; field descriptions are the CLI help."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine import cpu
from engine.llamacpp.gguf import DEFAULT_DRAFT_TYPE, DEFAULT_TARGET_TYPE, OUT_TYPES, TARGET_TYPES
from engine.options import Options

DEFAULT_MAX_MODEL_LEN = 2048
READY_TIMEOUT = 900.0


class ServerSettings(Options):
    """How one vLLM server runs: address, context length, dtype, KV cache."""

    host: str = Field("127.0.0.1", description="address to listen on")
    dtype: str = Field("bfloat16", description="weights/activations dtype on CPU")
    max_model_len: int = Field(DEFAULT_MAX_MODEL_LEN, ge=1, description="context length")
    kv_cache_gib: float | None = Field(None, gt=0, description="CPU KV cache in GiB",
                                       json_schema_extra={"shown_default": 2})


def default_dtype(flavor: str) -> str:
    """The dtype a vLLM build of this `flavor` ("cpu", "cuda") serves by default on this machine."""
    # a CPU without native bf16 emulates it: slower than float32, and its answers drift from the fp32 in-process ones
    return "float32" if flavor == "cpu" and not cpu.native_bf16() else ServerSettings.model_fields["dtype"].default


LLAMACPP_NGRAM = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
VLLM_ONLY = ("dtype", "kv_cache_gib", "form", "speculative_fields", "per_request_spec_decode_metrics")
LLAMACPP_ONLY = ("gguf_target", "gguf_draft", "p_min", "ngram", "threads")


class ServeOptions(ServerSettings):
    """`serve`: a draft and its target in real vLLM (its own environment) or real llama.cpp (llama-server, built
    once), as a job or in the foreground."""

    engine: Literal["vllm", "llama.cpp"] = Field("vllm", description="vllm: vLLM's OpenAI server (GPUs; its CPU "
                                                 "build here); llama.cpp: llama-server on GGUF files (CPUs)")
    draft: str | None = Field(None, description="draft folder (speculators format) to serve with its target")
    target: str | None = Field(None, description="built-in name, local folder or hub id of the target",
                               json_schema_extra={"shown_default": "the draft's verifier"})
    k: int | None = Field(None, ge=1, description="tokens drafted per step",
                          json_schema_extra={"shown_default": "the draft's own"})
    port: int | None = Field(None, ge=1, le=65535, description="port to listen on",
                             json_schema_extra={"shown_default": "8000, or a free one"})
    no_draft: bool = Field(False, description="serve the target alone (no speculative decoding)",
                           json_schema_extra={"store_true": True})
    form: Literal["auto", "explicit"] | None = Field(
        None, description="auto: the draft folder is the model (vLLM reads its verifier); explicit: the target with "
        "--speculative-config", json_schema_extra={"shown_default": "auto when the target is the draft's verifier"})
    speculative_fields: str | None = Field(
        None, description="more vLLM speculative_config fields as a JSON object, e.g. "
        "'{\"rejection_sample_method\": \"block\"}' (checked by vLLM's rules before the server starts; "
        "a lossy one, synthetic, is labelled LOSSY)")
    per_request_spec_decode_metrics: Literal["none", "summary", "detailed"] = Field(
        "none", description="vLLM's acceptance of each request in its response (`metrics.speculative_decoding`): "
        "summary = mean acceptance length, acceptance rate and the draft-length histogram; detailed = also every "
        "step's accepted and proposed counts; needs a draft")
    no_validate: bool = Field(False, description="do not refuse a draft our validator rejects",
                              json_schema_extra={"store_true": True})
    gguf_target: Literal[TARGET_TYPES] = Field(DEFAULT_TARGET_TYPE, description="llama.cpp: the target's GGUF "
                                               "(f32 = the weights the in-process engine decodes; shipped = the "
                                               "built-in's own quantized file)")
    gguf_draft: Literal[OUT_TYPES] = Field(DEFAULT_DRAFT_TYPE, description="llama.cpp: the draft's GGUF type")
    p_min: float | None = Field(None, ge=0, le=1, description="llama.cpp: stop a draft chain below this draft "
                                "probability (--spec-draft-p-min)")
    ngram: Literal[LLAMACPP_NGRAM] | None = Field(None, description="llama.cpp: an n-gram proposer, mixed with the "
                                                  "draft, or alone with --no-draft")
    threads: int | None = Field(None, ge=1, description="llama.cpp: CPU threads",
                                json_schema_extra={"shown_default": "every core"})
    timeout: float = Field(READY_TIMEOUT, gt=0, description="seconds to wait for the server to be ready")
    install_only: bool = Field(False, description="create the vLLM environment (with --engine llama.cpp: build "
                               "llama-server) and exit",
                               json_schema_extra={"store_true": True})
    foreground: bool = Field(False, description="serve in this process until Ctrl-C",
                             json_schema_extra={"store_true": True})

    @model_validator(mode="after")
    def _engine_fields(self):
        wrong = VLLM_ONLY if self.engine == "llama.cpp" else LLAMACPP_ONLY
        given = [f for f in wrong if f in self.model_fields_set and getattr(self, f) not in (None, False, "none")]
        if given:
            other = "vllm" if self.engine == "llama.cpp" else "llama.cpp"
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise ValueError(f"{flags} apply to --engine {other}, not {self.engine}")
        return self

    @field_validator("speculative_fields")
    @classmethod
    def _a_json_object(cls, value: str | None) -> str | None:
        if value is not None and not isinstance(_json_object(value), dict):
            raise ValueError("speculative_fields must be a JSON object, e.g. '{\"rejection_sample_method\": "
                             "\"block\"}'")
        return value

    def speculative_config(self) -> dict[str, Any] | None:
        """The user's extra speculative_config fields (None without any)."""
        return _json_object(self.speculative_fields) if self.speculative_fields else None

    def vllm_flags(self) -> list[str]:
        """vLLM command-line flags these options add to the server's own."""
        per_request = self.per_request_spec_decode_metrics
        return ["--per-request-spec-decode-metrics", per_request] if per_request != "none" else []

    def settings(self) -> ServerSettings:
        return ServerSettings(**{k: getattr(self, k) for k in ServerSettings.model_fields})


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"speculative_fields is not JSON ({exc.msg} at character {exc.pos})") from None
