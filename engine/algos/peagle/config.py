"""P-EAGLE's speculators config type (`peagle`): EAGLE-3's fields plus the parallel slots, vLLM's loading rules."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from engine.algos.eagle3.config import Eagle3Config, aux_ids_written, num_aux
from engine.format import vllm_rules as vr
from engine.format.config import register_config_type

SPECULATORS_NUM_DEPTHS = 8  # speculators 0.9.0's P-EAGLE depths, and so its k


@register_config_type
class PEagleConfig(Eagle3Config):
    """P-EAGLE: EAGLE-3 with parallel drafting slots filled by `mask_token_id` and a learned `mask_hidden`."""

    algorithm: ClassVar[str] = "peagle"
    default_architecture: ClassVar[str] = "PEagleSpeculator"
    config_class: ClassVar[str] = "PEagleSpeculatorConfig"
    uses_mask_token: ClassVar[bool] = True
    own_layer_config_keys: ClassVar[tuple[str, ...]] = ()
    default_draft_arch: ClassVar[str] = "qwen3"
    vllm_order: ClassVar[int] = 1
    vllm_method: ClassVar[dict[str, Any]] = {"method": "eagle3", "parallel_drafting": True}
    vllm_skipped_tensors: ClassVar[tuple[str, ...]] = ()
    vllm_required_tensors: ClassVar[dict[str, str]] = {
        "mask_hidden": "mask_hidden not found in weights but model is configured for parallel drafting. Please "
                       "provide mask_hidden in the weights."}
    vllm_archs: ClassVar[dict[str, str]] = {"qwen3": "PeagleQwen3ForCausalLM", "llama": "PeagleLlamaForCausalLM"}
    vllm_title: ClassVar[str] = "PEagle"
    llamacpp_spec_type: ClassVar[str | None] = None
    llamacpp_refusal: ClassVar[str] = ("llama.cpp (0.3.36) has no parallel-drafting EAGLE: its converter reads no "
                                       "PEagleSpeculator and llama-server has no such --spec-type")
    token_id_fields: ClassVar[dict[str, str]] = {
        "mask_token_id": "a token id the target never emits (the tokenizer's mask or pad token, or a spare row)"}

    speculators_model_type: Literal["peagle"] = "peagle"  # type: ignore[assignment]
    mask_token_id: int | None = Field(None, description="Placeholder token of parallel slots (vLLM `pard_token`).")
    embed_requires_grad: bool = Field(True, description="Train the token embedding (training-only flag).")

    @classmethod
    def default_speculative_tokens(cls, fields: dict[str, Any]) -> int:
        return fields.get("num_depths") or SPECULATORS_NUM_DEPTHS

    @classmethod
    def vllm_update(cls, cfg: dict, pre: dict) -> None:
        """`update_peagle` (speculators/algos.py)."""
        cls._vllm_shared(cfg, pre, norm_before_residual=False)
        cls._vllm_architecture(pre)
        if "mask_token_id" not in cfg:
            raise vr.VllmError("KeyError", "'mask_token_id'", field="mask_token_id")
        pre["pard_token"] = cfg["mask_token_id"]
        if cfg.get("eagle_aux_hidden_state_layer_ids"):
            pre["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]

    @classmethod
    def vllm_parameters(cls, hf: dict, d: vr.Dims) -> tuple[dict[str, tuple], set[str]]:
        exp, optional = super().vllm_parameters(hf, d)
        exp["mask_hidden"] = (1, 1, d.ht * num_aux(hf))
        return exp, optional

    @classmethod
    def validation_rules(cls) -> list:
        return [aux_ids_written]
