"""EAGLE-3's speculators config type (`eagle3`): its fields, default k and layers, vLLM's loading rules, checks."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from engine.format import vllm_rules as vr
from engine.format.config import DraftConfig, register_config_type
from engine.format.report import Issue, ValidationReport

SPECULATORS_TTT_STEPS = 3  # speculators 0.9.0's training-time-test steps, and so its k


@register_config_type
class Eagle3Config(DraftConfig):
    """EAGLE-3: one (or more) decoder layers over fused aux hidden states and the token embedding."""

    algorithm: ClassVar[str] = "eagle3"
    default_architecture: ClassVar[str] = "Eagle3Speculator"
    config_class: ClassVar[str] = "Eagle3SpeculatorConfig"
    aux_field: ClassVar[str] = "eagle_aux_hidden_state_layer_ids"
    own_layer_config_keys: ClassVar[tuple[str, ...]] = ("num_aux_hidden_states",)  # vLLM's Llama EAGLE-3 class
    default_draft_arch: ClassVar[str] = "llama"
    stores_embeddings: ClassVar[bool] = True
    vllm_skipped_tensors: ClassVar[tuple[str, ...]] = ("mask_hidden",)  # skipped when not parallel drafting
    vllm_archs: ClassVar[dict[str, str]] = {"qwen3": "Eagle3Qwen3ForCausalLM", "llama": "Eagle3LlamaForCausalLM"}
    vllm_title: ClassVar[str] = "Eagle3"
    llamacpp_spec_type: ClassVar[str | None] = "draft-eagle3"  # its converter reads Eagle3Speculator as it is
    llamacpp_aux_layers: ClassVar[int] = 3  # llama.cpp's EAGLE-3 graph reads exactly three target layers

    speculators_model_type: Literal["eagle3"] = "eagle3"
    eagle_aux_hidden_state_layer_ids: list[int] | None = Field(
        None, description="Verifier layer ids whose residual stream feeds the draft (id k = input of layer k)."
    )
    norm_before_residual: bool = Field(False, description="First layer takes its residual after hidden_norm.")
    norm_before_fc: bool = Field(False,
                                 description="One RMSNorm (input_norm) over the concatenated aux states before fc.")
    fc_norm: bool = Field(False, description="One RMSNorm per aux state (fc_norm.i) before fc.")
    norm_output: bool = Field(False,
                              description="Feed the post-norm hidden state to the next draft step ('Eagle 3.1').")
    embed_requires_grad: bool = Field(False, description="Train the token embedding (training-only flag).")

    @model_validator(mode="after")
    def _norms_exclusive(self):
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
        return self

    @classmethod
    def default_speculative_tokens(cls, fields: dict[str, Any]) -> int:
        return fields.get("ttt_steps") or SPECULATORS_TTT_STEPS

    @classmethod
    def vllm_update(cls, cfg: dict, pre: dict) -> None:
        """`update_eagle3` (speculators/algos.py)."""
        cls._vllm_shared(cfg, pre, norm_before_residual=True)
        pre["fc_norm"] = cfg.get("fc_norm", False)
        pre["norm_output"] = cfg.get("norm_output", False)
        cls._vllm_architecture(pre)
        if cfg.get("eagle_aux_hidden_state_layer_ids"):
            pre["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]

    @staticmethod
    def _vllm_shared(cfg: dict, pre: dict, *, norm_before_residual: bool) -> None:
        """What vLLM's update_eagle3 and update_peagle both copy (their norm_before_residual defaults differ)."""
        pre["draft_vocab_size"] = cfg.get("draft_vocab_size")
        if cfg.get("target_hidden_size") is not None:
            pre["target_hidden_size"] = cfg["target_hidden_size"]
        pre["norm_before_residual"] = cfg.get("norm_before_residual", norm_before_residual)
        pre["norm_before_fc"] = cfg.get("norm_before_fc", False)

    @classmethod
    def _vllm_architecture(cls, pre: dict) -> None:
        model_type = pre.get("model_type", "llama")
        if model_type not in cls.vllm_archs:
            raise vr.VllmError("ValueError", f"Unsupported model_type {model_type} for {cls.vllm_title} speculator",
                               field="transformer_layer_config.model_type")
        pre["architectures"] = [cls.vllm_archs[model_type]]

    @classmethod
    def vllm_parameters(cls, hf: dict, d: vr.Dims) -> tuple[dict[str, tuple], set[str]]:
        a = num_aux(hf)
        exp: dict[str, tuple] = {"fc.weight": (d.h, d.ht * a)}
        for i in range(d.layers):
            exp.update(vr.attn_mlp(f"layers.{i}.", d, 2 * d.h if i == 0 else d.h, qk_norm=d.qwen))
        exp["layers.0.hidden_norm.weight"] = (d.h,)
        exp["norm.weight"] = (d.h,)
        if hf.get("norm_before_fc"):
            exp["input_norm.weight"] = (d.ht * a,)
        if hf.get("fc_norm"):
            exp.update({f"fc_norm.{k}.weight": (d.ht,) for k in range(a)})
        return exp, set()

    @classmethod
    def llamacpp_problem(cls, cfg: dict[str, Any]) -> str | None:
        if cls.llamacpp_spec_type is None:
            return cls.llamacpp_refusal
        ids = cfg.get(cls.aux_field) or []
        if len(ids) != cls.llamacpp_aux_layers:
            return (f"it reads {len(ids)} target layers ({cls.aux_field} = {ids}), and llama.cpp's EAGLE-3 reads "
                    f"exactly {cls.llamacpp_aux_layers}")
        return None

    @classmethod
    def validation_rules(cls) -> list:
        return [aux_ids_written, llama_aux_count]


def num_aux(hf: dict[str, Any]) -> int:
    """How many aux states vLLM's EAGLE-3 class assumes (llama_eagle3.py l.209-221, qwen3_eagle3.py l.201-214)."""
    eagle_cfg = hf.get("eagle_config") or {}
    architectures = hf.get("architectures", [])
    if "Eagle3Qwen3ForCausalLM" in architectures or "PeagleQwen3ForCausalLM" in architectures:
        for key in ("num_aux_layers", "num_aux_hidden_states"):
            if hf.get(key):
                return int(hf[key])
        ids = hf.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
        return len(ids) if ids else 3
    if hf.get("num_aux_hidden_states"):
        return int(hf["num_aux_hidden_states"])
    ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")  # top-level ids are NOT consulted by the Llama class
    return len(ids) if ids else 3


def aux_ids_written(cfg, typed, hf, report: ValidationReport) -> None:
    name = Eagle3Config.aux_field
    if not cfg.get(name):
        report.add(Issue(name, "not set: vLLM falls back to the target's default aux layers [2, N//2, N-3]; write the "
                         "ids the draft was trained with", severity="warning"))


def llama_aux_count(cfg, typed, hf, report: ValidationReport) -> None:
    ids = cfg.get(Eagle3Config.aux_field)
    if hf is not None and "Eagle3LlamaForCausalLM" in hf.get("architectures", []) and isinstance(ids, list) and ids:
        a = num_aux(hf)
        if len(ids) != a:
            report.add(Issue("transformer_layer_config.num_aux_hidden_states",
                             f"{len(ids)} aux layers, but vLLM's Llama EAGLE-3 class ignores the top-level ids and "
                             f"assumes {a}; add \"num_aux_hidden_states\": {len(ids)} to transformer_layer_config"))
