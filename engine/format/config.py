"""Typed speculators-format draft configs (eagle3, peagle, dflash, dflash2, dspark) in speculators 0.9.0's exact layout."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
    proposal_methods: list[ProposalMethod] = Field(..., min_length=1, description="Proposal methods; vLLM uses the first.")
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

    speculators_model_type: str = Field(..., description="Algorithm discriminator read by vLLM and speculators.")
    architectures: list[str] = Field(default_factory=list, description="Class name; informative only (vLLM overrides it).")
    auto_map: dict[str, str] = Field(default_factory=dict, description="speculators' config class map.")
    speculators_config: SpeculatorsInfo
    speculators_version: str = Field(SPECULATORS_VERSION, description="speculators version of the format.")
    transformer_layer_config: dict[str, Any] = Field(
        ..., description="The draft decoder's Hugging Face config (model_type selects Llama or Qwen3 layers)."
    )
    transformers_version: str | None = Field(None, description="transformers version that wrote the config.")
    draft_vocab_size: int = Field(32000, ge=1, description="Rows of the draft lm_head (= verifier vocab means no reduction).")
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
        return eagle_default_layer_ids(num_layers)

    def max_speculative_tokens(self) -> int | None:
        """The most tokens one draft step can propose (None: no structural limit)."""
        return None

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        """The exact `config.json` structure speculators 0.9.0 writes (keys sorted on dump)."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


class Eagle3Config(DraftConfig):
    """EAGLE-3: one (or more) decoder layers over fused aux hidden states and the token embedding."""

    algorithm: ClassVar[str] = "eagle3"
    default_architecture: ClassVar[str] = "Eagle3Speculator"
    config_class: ClassVar[str] = "Eagle3SpeculatorConfig"
    aux_field: ClassVar[str] = "eagle_aux_hidden_state_layer_ids"
    own_layer_config_keys: ClassVar[tuple[str, ...]] = ("num_aux_hidden_states",)  # vLLM's Llama EAGLE-3 class

    speculators_model_type: Literal["eagle3"] = "eagle3"
    eagle_aux_hidden_state_layer_ids: list[int] | None = Field(
        None, description="Verifier layer ids whose residual stream feeds the draft (id k = input of layer k)."
    )
    norm_before_residual: bool = Field(False, description="First layer takes its residual after hidden_norm.")
    norm_before_fc: bool = Field(False, description="One RMSNorm (input_norm) over the concatenated aux states before fc.")
    fc_norm: bool = Field(False, description="One RMSNorm per aux state (fc_norm.i) before fc.")
    norm_output: bool = Field(False, description="Feed the post-norm hidden state to the next draft step ('Eagle 3.1').")
    embed_requires_grad: bool = Field(False, description="Train the token embedding (training-only flag).")

    @model_validator(mode="after")
    def _norms_exclusive(self):
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
        return self


class PEagleConfig(Eagle3Config):
    """P-EAGLE: EAGLE-3 with parallel drafting slots filled by `mask_token_id` and a learned `mask_hidden`."""

    algorithm: ClassVar[str] = "peagle"
    default_architecture: ClassVar[str] = "PEagleSpeculator"
    config_class: ClassVar[str] = "PEagleSpeculatorConfig"
    uses_mask_token: ClassVar[bool] = True
    own_layer_config_keys: ClassVar[tuple[str, ...]] = ()

    speculators_model_type: Literal["peagle"] = "peagle"  # type: ignore[assignment]
    mask_token_id: int | None = Field(None, description="Placeholder token of parallel slots (vLLM `pard_token`).")
    embed_requires_grad: bool = Field(True, description="Train the token embedding (training-only flag).")


class DFlashConfig(DraftConfig):
    """DFlash: a block of mask tokens denoised in one pass, with verifier features as extra K/V."""

    algorithm: ClassVar[str] = "dflash"
    default_architecture: ClassVar[str] = "DFlashSpeculator"
    config_class: ClassVar[str] = "DFlashSpeculatorConfig"
    uses_mask_token: ClassVar[bool] = True

    speculators_model_type: Literal["dflash"] = "dflash"
    block_size: int = Field(8, ge=2, description="Tokens per draft block (anchor + mask slots).")
    aux_hidden_state_layer_ids: list[int] | None = Field(None, description="Verifier layer ids fused by fc.")
    mask_token_id: int | None = Field(None, description="Token id placed in the mask slots of a block.")
    sliding_window_non_causal: bool = Field(False, description="Sliding-window layers are bidirectional inside a block.")
    sample_from_anchor: bool = Field(False, description="All block slots predict (True) or slot 0 is the anchor (False).")

    @classmethod
    def default_aux_layer_ids(cls, num_layers: int) -> list[int]:
        return evenly_spaced_layer_ids(num_layers)

    def max_speculative_tokens(self) -> int | None:
        return self.block_size if self.sample_from_anchor else self.block_size - 1


class DFlash2Config(DFlashConfig):
    """DFlash2 (experimental): DFlash plus dynamic causal convolutions and a candidate selector."""

    algorithm: ClassVar[str] = "dflash2"
    default_architecture: ClassVar[str] = "DFlash2DraftModel"
    config_class: ClassVar[str] = "DFlash2SpeculatorConfig"

    speculators_model_type: Literal["dflash2"] = "dflash2"  # type: ignore[assignment]
    sliding_window_non_causal: bool = Field(True, description="Sliding-window layers are bidirectional inside a block.")
    conv_kernel_size: int = Field(2, ge=1, description="Taps of the grouped dynamic causal convolution.")
    conv_group_size: int = Field(16, ge=1, description="Channels per convolution group (must divide hidden size).")
    selector_rank: int = Field(256, ge=1, description="Rank of the candidate selector codebooks.")
    selector_top_k: int = Field(16, ge=1, description="Candidates rescored by the selector.")


class DSparkConfig(DFlashConfig):
    """DSpark: DFlash backbone plus a sequential Markov head and a confidence head."""

    algorithm: ClassVar[str] = "dspark"
    default_architecture: ClassVar[str] = "DSparkSpeculator"
    config_class: ClassVar[str] = "DSparkSpeculatorConfig"

    speculators_model_type: Literal["dspark"] = "dspark"  # type: ignore[assignment]
    sample_from_anchor: bool = Field(True, description="All block slots predict (DSpark convention).")
    markov_rank: int = Field(256, ge=0, description="Rank of the Markov head (0 disables it).")
    markov_head_type: Literal["vanilla", "gated", "rnn"] = Field("vanilla", description="Markov head variant.")
    enable_confidence_head: bool = Field(True, description="Train a per-slot confidence head.")
    confidence_head_with_markov: bool = Field(True, description="Confidence head also sees the Markov state.")
    confidence_temperatures: list[float] | None = Field(
        None, description="Per-slot temperatures of the confidence head, fitted after training (sequential "
                          "temperature scaling; the workbench's own field, vLLM and speculators ignore it).")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if out.get("confidence_temperatures") is None:  # uncalibrated: exactly speculators' field set
            out.pop("confidence_temperatures", None)
        return out


def eagle_default_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers for an N-layer verifier: [2, N//2, N-3] (P-EAGLE shares it)."""
    n = num_layers
    return sorted({min(max(i, 0), n) for i in (2, n // 2, n - 3)})


# the number of draft layers z-lab's DFlash trainer (and speculators') builds by default
DFLASH_DEFAULT_LAYERS = 5


def evenly_spaced_layer_ids(num_layers: int, count: int = DFLASH_DEFAULT_LAYERS) -> list[int]:
    """`count` aux ids spread evenly over 2..N-2, the vLLM ids of z-lab DFlash's target layers.

    z-lab picks the outputs of decoder layers 1..N-3 (its `target_layer_ids`); the output of layer k is vLLM
    id k+1, so the aux ids run from 2 to N-2. Qwen3-8B (N=36) with 5 draft layers gives [2, 10, 18, 26, 34],
    the ids the speculators converter writes for z-lab's Qwen3-8B-DFlash-b16. One draft layer reads N//2.
    """
    if count < 1:
        raise ValueError(f"cannot pick {count} layers: use at least one")
    if count == 1:
        return [num_layers // 2 + 1]
    first, last = 2, max(2, num_layers - 2)
    ids = [first + int(i * (last - first) / (count - 1) + 0.5) for i in range(count)]  # round half up
    return sorted(set(min(max(i, 0), num_layers) for i in ids))


CONFIG_CLASSES: dict[str, type[DraftConfig]] = {
    c.algorithm: c for c in (Eagle3Config, PEagleConfig, DFlashConfig, DFlash2Config, DSparkConfig)
}


def algorithms() -> list[str]:
    return list(CONFIG_CLASSES)


def parse_draft_config(data: dict[str, Any]) -> DraftConfig:
    """Typed config from a config.json dict; raises KeyError (unknown type) or pydantic ValidationError."""
    kind = data.get("speculators_model_type")
    if kind not in CONFIG_CLASSES:
        raise KeyError(kind)
    return CONFIG_CLASSES[kind].model_validate(data)


def speculative_tokens_default(algorithm: str, *, ttt_steps: int = 3, num_depths: int = 8,
                               block_size: int = 8, sample_from_anchor: bool = False) -> int:
    """What speculators' trainers write as `speculative_tokens` for each algorithm."""
    if algorithm == "eagle3":
        return ttt_steps
    if algorithm == "peagle":
        return num_depths
    return block_size if sample_from_anchor else block_size - 1


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

    cls = CONFIG_CLASSES[algorithm]
    if layer_config is None:
        model_type = fields.pop("draft_arch", "llama" if algorithm == "eagle3" else "qwen3")
        layer_config = build_layer_config(
            verifier_config, model_type=model_type, num_layers=fields.pop("num_layers", 1)
        )
    vcfg = verifier_config.to_dict() if hasattr(verifier_config, "to_dict") else dict(verifier_config)
    if speculative_tokens is None:
        speculative_tokens = speculative_tokens_default(
            algorithm,
            block_size=fields.get("block_size", cls.model_fields["block_size"].default)
            if "block_size" in cls.model_fields else 8,
            sample_from_anchor=fields.get("sample_from_anchor", cls.model_fields["sample_from_anchor"].default)
            if "sample_from_anchor" in cls.model_fields else False,
        )
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


__all__ = [
    "CONFIG_CLASSES", "DFlash2Config", "DFlashConfig", "DSparkConfig", "DraftConfig", "Eagle3Config",
    "PEagleConfig", "ProposalMethod", "SpeculatorsInfo", "ValidationError", "VerifierInfo", "algorithms",
    "build_draft_config", "build_layer_config", "parse_draft_config",
]
