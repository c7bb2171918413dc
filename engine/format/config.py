"""The generic speculators-format draft config (speculators 0.9.0's exact layout) and the registry of its types.

Each algorithm folder (`engine/algos/<name>/config.py`) subclasses `DraftConfig` and registers it with
`@register_config_type`; importing `engine.algos` fills `CONFIG_TYPES`. Nothing here names an algorithm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.errors import WorkbenchError
from engine.registry import Registry

SPECULATORS_VERSION = "0.9.0"  # the format version we write (and test against)


class ProposalMethod(BaseModel):
    """One entry of `speculators_config.proposal_methods` (only `greedy` exists in speculators 0.9.0)."""

    model_config = ConfigDict(extra="allow")
    proposal_type: Literal["greedy"] = Field("greedy", description="Proposal method; speculators has only 'greedy'.")
    speculative_tokens: int = Field(
        5, ge=1, description="Tokens drafted per step; vLLM uses it as `num_speculative_tokens`."
    )
    verifier_accept_k: int = Field(1, ge=1, description="Top-k of the verifier accepted (1 = exact match).")
    accept_tolerance: float = Field(0.0, ge=0.0, description="Acceptance tolerance (0 = lossless).")


class VerifierInfo(BaseModel):
    """The target (verifier) model the draft was trained for."""

    model_config = ConfigDict(extra="allow")
    name_or_path: str | None = Field(
        None, description="Hub id of the verifier; `vllm serve <draft>` serves this model as the target."
    )
    architectures: list[str] = Field(default_factory=list, description="The verifier's own architectures.")


class SpeculatorsInfo(BaseModel):
    """The `speculators_config` block."""

    model_config = ConfigDict(extra="allow")
    algorithm: str = Field(..., description="Algorithm name, same as `speculators_model_type`.")
    proposal_methods: list[ProposalMethod] = Field(..., min_length=1,
                                                   description="Proposal methods; vLLM uses the first.")
    default_proposal_method: str = Field("greedy", description="Must name the proposal_type of one entry.")
    verifier: VerifierInfo

    @model_validator(mode="after")
    def _default_is_listed(self):
        if self.default_proposal_method not in {m.proposal_type for m in self.proposal_methods}:
            raise ValueError(f"default_proposal_method '{self.default_proposal_method}' matches no proposal method")
        return self


class DraftConfig(BaseModel):
    """Fields common to every speculators draft config (speculators `SpeculatorModelConfig`)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    algorithm: ClassVar[str] = ""
    default_architecture: ClassVar[str] = ""
    config_class: ClassVar[str] = ""
    aux_field: ClassVar[str] = "aux_hidden_state_layer_ids"  # the field holding the verifier layer ids
    uses_mask_token: ClassVar[bool] = False  # parallel slots are filled with `mask_token_id`
    # transformer_layer_config keys that vLLM reads only for this type
    own_layer_config_keys: ClassVar[tuple[str, ...]] = ()
    default_draft_arch: ClassVar[str] = "qwen3"  # transformer_layer_config.model_type of a fresh config
    # what engine/format/vllm_rules.py and validate.py ask of a type (its folder fills them in)
    vllm_served: ClassVar[bool] = True  # vLLM 0.33 registers this speculators type
    vllm_order: ClassVar[int] = 0  # its place in vLLM's registry (speculators/algos.py), for vLLM's own message
    vllm_cpu_refusal: ClassVar[str | None] = None  # vLLM's words where its CPU build refuses the type at start
    #                                                (validate warns; the model card says where it is served)
    vllm_method: ClassVar[dict[str, Any]] = {}  # overrides of vLLM's speculative config (default: method = type)
    needs_speculative_tokens: ClassVar[bool] = True  # vLLM refuses the config without a k
    # speculative-config fields vLLM takes for this method only: field -> (declared type, vLLM's refusal elsewhere)
    vllm_own_fields: ClassVar[dict[str, tuple[Any, str]]] = {}
    vllm_adaptive_verification: ClassVar[bool] = False  # vLLM may estimate acceptance without draft logits
    stores_embeddings: ClassVar[bool] = False  # speculators builds its own embed_tokens for this type
    vllm_skipped_tensors: ClassVar[tuple[str, ...]] = ()  # tensors vLLM's loader skips with a warning
    vllm_refused_tensors: ClassVar[dict[str, str]] = {}  # tensor -> vLLM's AssertionError when present
    vllm_required_tensors: ClassVar[dict[str, str]] = {}  # tensor -> vLLM's ValueError when absent
    # fields holding ids into the verifier's vocabulary -> what a valid id is (validate checks the range)
    token_id_fields: ClassVar[dict[str, str]] = {}
    # llama.cpp (engine/llamacpp): llama-server's --spec-type for this type, or why it runs none
    llamacpp_spec_type: ClassVar[str | None] = None
    llamacpp_refusal: ClassVar[str] = "llama.cpp runs no draft of this type"

    speculators_model_type: str = Field(..., description="Algorithm discriminator read by vLLM and speculators.")
    architectures: list[str] = Field(default_factory=list,
                                     description="Class name; informative only (vLLM overrides it).")
    auto_map: dict[str, str] = Field(default_factory=dict, description="speculators' config class map.")
    speculators_config: SpeculatorsInfo
    speculators_version: str = Field(SPECULATORS_VERSION, description="speculators version of the format.")
    transformer_layer_config: dict[str, Any] = Field(
        ..., description="The draft decoder's Hugging Face config (model_type selects Llama or Qwen3 layers)."
    )
    transformers_version: str | None = Field(None, description="transformers version that wrote the config.")
    draft_vocab_size: int = Field(32000, ge=1,
                                  description="Rows of the draft lm_head (= verifier vocab means no reduction).")
    target_hidden_size: int | None = Field(None, description="Verifier hidden size when it differs from the draft's.")

    # -- convenience ---------------------------------------------------------------------------
    @property
    def layer_config(self) -> dict[str, Any]:
        return self.transformer_layer_config

    @property
    def hidden_size(self) -> int:
        return int(self.transformer_layer_config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.transformer_layer_config["vocab_size"])

    @property
    def num_layers(self) -> int:
        return int(self.transformer_layer_config.get("num_hidden_layers", 1))

    @property
    def speculative_tokens(self) -> int:
        return self.speculators_config.proposal_methods[0].speculative_tokens

    @property
    def verifier_name(self) -> str | None:
        return self.speculators_config.verifier.name_or_path

    @property
    def aux_layer_ids(self) -> list[int] | None:
        return getattr(self, self.aux_field, None)

    @classmethod
    def default_aux_layer_ids(cls, num_layers: int) -> list[int]:
        """The verifier layer ids (vLLM semantics) a draft of this type reads by default, for an N-layer target."""
        return vllm_default_aux_layer_ids(num_layers)

    @classmethod
    def default_speculative_tokens(cls, fields: dict[str, Any]) -> int:
        """The k a fresh draft records, from its structural fields (config fields or training arguments of the
        same names): the one place each type's default k is computed."""
        raise NotImplementedError(f"{cls.__name__} gives no default speculative_tokens")

    def max_speculative_tokens(self) -> int | None:
        """The most tokens one draft step can propose (None: no structural limit)."""
        return None

    def k_limit_reason(self) -> str:
        """Why k cannot exceed `max_speculative_tokens` (validate's message)."""
        return f"a {self.algorithm} draft drafts at most {self.max_speculative_tokens()} tokens per step"

    # -- vLLM's loader for this type (engine/format/vllm_rules.py calls these) ------------------
    @classmethod
    def vllm_update(cls, cfg: dict[str, Any], pre: dict[str, Any]) -> None:
        """vLLM's `update_<type>` (speculators/algos.py): fill the draft hf_config `pre` from config.json `cfg`."""
        raise NotImplementedError(f"{cls.__name__} has no vLLM loading rules")

    @classmethod
    def vllm_parameters(cls, hf: dict[str, Any], dims: Any) -> tuple[dict[str, tuple], set[str]]:
        """The tensors vLLM's draft class for this type creates (name -> shape) beyond lm_head/embed_tokens/d2t,
        and which of them are optional; `dims` are the decoder's sizes (vllm_rules.Dims)."""
        raise NotImplementedError(f"{cls.__name__} has no vLLM parameter rules")

    @classmethod
    def validation_rules(cls) -> list:
        """The type's own checks, each `rule(cfg, typed, hf, report)` adding `engine.format.report.Issue`s."""
        return []

    @classmethod
    def vllm_own_form(cls, cfg: dict[str, Any]) -> str | None:
        """Why vLLM reaches this draft only through a folder in its own form (None: the draft folder serves)."""
        return None

    @classmethod
    def write_vllm_own_form(cls, cfg: dict[str, Any], draft: Path, out: Path) -> Path:
        """Write the folder of `vllm_own_form` for the draft folder `draft` (its config.json `cfg`) to `out` (atomic)
        and return it."""
        raise NotImplementedError(f"{cls.__name__} is served from its own folder")

    @classmethod
    def llamacpp_problem(cls, cfg: dict[str, Any]) -> str | None:
        """Why llama.cpp cannot run the draft of config.json `cfg` (None: it can)."""
        return None if cls.llamacpp_spec_type else cls.llamacpp_refusal

    @classmethod
    def write_llamacpp_form(cls, cfg: dict[str, Any], draft: Path, out: Path) -> Path | None:
        """Write the folder llama.cpp's converter reads for the draft folder `draft` to `out` and return it; None:
        the converter reads the draft folder as it is."""
        return None

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        """The exact `config.json` structure speculators 0.9.0 writes (keys sorted on dump)."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


CONFIG_TYPES: Registry[type[DraftConfig]] = Registry("speculators config type")


def register_config_type(cls: type[DraftConfig]) -> type[DraftConfig]:
    """Class decorator: register a config class under its `speculators_model_type` (its `algorithm`)."""
    if not cls.algorithm:
        raise ValueError(f"{cls.__name__} names no algorithm")
    CONFIG_TYPES.register(cls.algorithm)(cls)
    return cls


class UnknownConfigType(WorkbenchError, KeyError):
    """A `speculators_model_type` no registered config class reads (a KeyError too, for older callers)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return WorkbenchError.__str__(self)


def config_types() -> list[str]:
    """The registered speculators types, in registration order (filled when `engine.algos` is imported)."""
    return CONFIG_TYPES.names()


def vllm_own_form(cfg: dict[str, Any]) -> str | None:
    """Why vLLM reaches this draft (a config.json dict) only through a folder in its own form, as its type says; None
    for the draft folder itself, or a type the workbench does not know (validate says so)."""
    kind = cfg.get("speculators_model_type")
    return CONFIG_TYPES.get(kind).vllm_own_form(cfg) if isinstance(kind, str) and kind in CONFIG_TYPES else None


def config_type(kind: Any) -> type[DraftConfig]:
    """The config class of a speculators type, or a clear error naming the known types."""
    if not config_types():
        raise WorkbenchError("no draft algorithm is registered, so no config type can be read",
                             hint="import engine.algos first (the CLI, the app and the tests' conftest do)")
    if not isinstance(kind, str) or kind not in CONFIG_TYPES:
        raise UnknownConfigType(f"unknown speculators_model_type {json.dumps(kind)}",
                                hint=f"the workbench reads {config_types()}; a draft of another type is not a "
                                     "speculators draft it knows")
    return CONFIG_TYPES.get(kind)


def parse_draft_config(data: dict[str, Any]) -> DraftConfig:
    """Typed config from a config.json dict; raises UnknownConfigType (a KeyError) or pydantic ValidationError."""
    return config_type(data.get("speculators_model_type")).model_validate(data)


# Keys of the verifier config that a draft decoder inherits.
_INHERITED = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters", "vocab_size",
)


def build_layer_config(
    verifier_config: Any,
    *,
    model_type: str,
    num_layers: int,
    sliding_window: int | None = 2048,
    full_attention_indices: list[int] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Draft decoder config from the verifier's, serialised like speculators (`to_diff_dict`).

    Every layer is sliding-window (2048) by default, as speculators 0.9.0 writes it.
    """
    from transformers import AutoConfig

    src = verifier_config.to_dict() if hasattr(verifier_config, "to_dict") else dict(verifier_config)
    if "text_config" in src and "hidden_size" not in src:
        src = src["text_config"]
    kwargs = {k: src[k] for k in _INHERITED if src.get(k) is not None}
    rope = kwargs.get("rope_parameters")
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        # keyed by layer type (Gemma 3: local and global RoPE): the draft's layers take the global one
        kwargs["rope_parameters"] = dict(rope.get("full_attention") or next(iter(rope.values())))
    if "head_dim" not in kwargs:
        kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    full = set(full_attention_indices or [])
    if sliding_window:
        kwargs["layer_types"] = ["full_attention" if i in full else "sliding_attention" for i in range(num_layers)]
        kwargs["sliding_window"] = sliding_window
        kwargs["use_sliding_window"] = True
    kwargs.update(num_hidden_layers=num_layers, tie_word_embeddings=False)
    kwargs.update(overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    out = config.to_diff_dict()
    out.pop("transformers_version", None)
    return json.loads(json.dumps(out))


def build_draft_config(
    algorithm: str,
    *,
    verifier_config: Any,
    verifier_name: str | None,
    layer_config: dict[str, Any] | None = None,
    speculative_tokens: int | None = None,
    **fields: Any,
) -> DraftConfig:
    """A fresh draft config in speculators' layout. `fields` are algorithm fields (e.g. draft_vocab_size)."""
    import transformers

    cls = config_type(algorithm)
    if layer_config is None:
        model_type = fields.pop("draft_arch", cls.default_draft_arch)
        layer_config = build_layer_config(
            verifier_config, model_type=model_type, num_layers=fields.pop("num_layers", 1)
        )
    vcfg = verifier_config.to_dict() if hasattr(verifier_config, "to_dict") else dict(verifier_config)
    if speculative_tokens is None:
        speculative_tokens = cls.default_speculative_tokens(fields)
    return cls(
        architectures=[cls.default_architecture],
        auto_map={"": f"config.{cls.config_class}"},
        speculators_config=SpeculatorsInfo(
            algorithm=algorithm,
            proposal_methods=[ProposalMethod(speculative_tokens=speculative_tokens)],
            default_proposal_method="greedy",
            verifier=VerifierInfo(name_or_path=verifier_name, architectures=list(vcfg.get("architectures") or [])),
        ),
        speculators_version=SPECULATORS_VERSION,
        transformer_layer_config=layer_config,
        transformers_version=transformers.__version__,
        **fields,
    )


def vllm_default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's fallback aux layers for an N-layer verifier when a draft records none: [2, N//2, N-3]."""
    n = num_layers
    return sorted({min(max(i, 0), n) for i in (2, n // 2, n - 3)})


def field_default(cls: type[BaseModel], fields: dict[str, Any], name: str) -> Any:
    """`fields[name]`, else the default of `cls`'s field `name` (for default_speculative_tokens)."""
    return fields[name] if fields.get(name) is not None else cls.model_fields[name].default


__all__ = [
    "CONFIG_TYPES", "DraftConfig", "ProposalMethod", "SpeculatorsInfo", "UnknownConfigType", "ValidationError",
    "VerifierInfo", "build_draft_config", "build_layer_config", "config_type", "config_types", "field_default",
    "parse_draft_config", "register_config_type", "vllm_default_aux_layer_ids",
]


# -- numbers a config cannot hold: NaN/inf anywhere, and values outside the range a field allows ------------------

# A field of this name (at any depth) must be a number > 0: a model cannot be built or run with zero or less.
POSITIVE_FIELDS = frozenset({
    "rms_norm_eps", "layer_norm_eps", "norm_eps", "rope_theta", "hidden_size", "intermediate_size",
    "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "head_dim", "vocab_size", "draft_vocab_size",
    "max_position_embeddings", "target_hidden_size", "block_size", "speculative_tokens",
})


def number_problems(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(JSON path, what is wrong) for every non-finite number (NaN, inf) anywhere in a JSON/YAML value, and every
    POSITIVE_FIELDS number that is not > 0. Python's json and YAML read NaN and Infinity without complaint."""
    import math

    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            found += number_problems(item, child)
            if (key in POSITIVE_FIELDS and isinstance(item, (int, float)) and not isinstance(item, bool)
                    and math.isfinite(item) and item <= 0):
                found.append((child, f"must be greater than 0, got {item}"))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found += number_problems(item, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        found.append((path or "value", f"is {value} (not a finite number); give a finite value"))
    return found


def refuse_bad_numbers(value: Any, where: str) -> None:
    """Raise a WorkbenchError naming every non-finite or out-of-range number in `value` (see `number_problems`)."""
    problems = number_problems(value)
    if problems:
        listing = "; ".join(f"`{p}` {what}" for p, what in problems[:8])
        raise WorkbenchError(f"{listing}{' (and more)' if len(problems) > 8 else ''}", where=where,
                             hint="correct those values (NaN and inf are never valid here)")
