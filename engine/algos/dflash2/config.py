"""DFlash2's speculators config type (`dflash2`): DFlash plus dynamic convolutions and a candidate selector."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from engine.algos.dflash.config import DFlashConfig
from engine.format import vllm_rules as vr
from engine.format.config import register_config_type
from engine.format.report import Issue, ValidationReport

# vLLM 0.33 (config/vllm.py, `_get_v1_model_runner_unsupported_features`): a DFlash2 draft's candidate selector runs
# only in the V2 model runner's DFlash2 speculator, which needs Triton; the CPU build has no Triton, runs V1 and
# refuses the draft when the server starts (V1's DFlash proposer would silently drop the selector).
VLLM_V1_REFUSAL = "Model Runner V1 does not support: DFlash candidate-head drafts"
LLAMACPP_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@register_config_type
class DFlash2Config(DFlashConfig):
    """DFlash2 (experimental): DFlash plus dynamic causal convolutions and a candidate selector."""

    algorithm: ClassVar[str] = "dflash2"
    default_architecture: ClassVar[str] = "DFlash2DraftModel"
    config_class: ClassVar[str] = "DFlash2SpeculatorConfig"
    vllm_order: ClassVar[int] = 3
    vllm_cpu_refusal: ClassVar[str | None] = VLLM_V1_REFUSAL
    vllm_method: ClassVar[dict[str, Any]] = {"method": "dflash"}
    llamacpp_architecture: ClassVar[str] = "DFlash2DraftModel"

    speculators_model_type: Literal["dflash2"] = "dflash2"  # type: ignore[assignment]
    sliding_window_non_causal: bool = Field(True, description="Sliding-window layers are bidirectional inside a block.")
    conv_kernel_size: int = Field(2, ge=1, description="Taps of the grouped dynamic causal convolution.")
    conv_group_size: int = Field(16, ge=1, description="Channels per convolution group (must divide hidden size).")
    selector_rank: int = Field(256, ge=1, description="Rank of the candidate selector codebooks.")
    selector_top_k: int = Field(16, ge=1, description="Candidates rescored by the selector.")

    @classmethod
    def vllm_update(cls, cfg: dict, pre: dict) -> None:
        """`update_dflash2` (speculators/algos.py)."""
        super().vllm_update(cfg, pre)
        pre["architectures"] = ["DFlash2DraftModel"]
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            if cfg.get(key) is not None:
                pre["dflash_config"][key] = cfg[key]

    @classmethod
    def vllm_parameters(cls, hf: dict, d: vr.Dims) -> tuple[dict[str, tuple], set[str]]:
        exp, optional = super().vllm_parameters(hf, d)
        dc = hf.get("dflash_config", {})
        k, g, r = dc.get("conv_kernel_size", 2), dc.get("conv_group_size", 16), dc.get("selector_rank", 256)
        for i in range(d.layers):
            for conv in ("attention_conv", "mlp_conv"):
                exp[f"layers.{i}.{conv}.base_kernel"] = (2, k, d.h)
                exp[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * k * (d.h // max(g, 1)), d.h)
        exp["candidate_selector.predecessor_codebook"] = (d.vocab, r)
        exp["candidate_selector.successor_codebook"] = (d.vocab, r)
        exp["candidate_selector.hidden_projection.weight"] = (r, d.h)
        return exp, optional

    @classmethod
    def validation_rules(cls) -> list:
        return [*super().validation_rules(), constraints]

    @classmethod
    def llamacpp_dflash_fields(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        """The convolution and selector sizes, which llama.cpp's converter reads from z-lab's `dflash_config`."""
        return {key: cfg.get(key, cls.model_fields[key].default) for key in LLAMACPP_FIELDS}


def constraints(cfg, typed, hf, report: ValidationReport) -> None:
    if typed is None:
        return
    h = typed.hidden_size
    if h % typed.conv_group_size:
        report.add(Issue("conv_group_size", f"{typed.conv_group_size} does not divide hidden_size {h}"))
    if typed.reduced_vocab:
        report.add(Issue("draft_vocab_size", "dflash2 requires the full verifier vocabulary"))
    if typed.sample_from_anchor:
        report.add(Issue("sample_from_anchor", "dflash2 requires sample_from_anchor=false"))
