"""DFlash's speculators config type (`dflash`): its fields, default k and layers, vLLM's loading rules, checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from engine.algos.dflash.llamacpp_form import form_problem, write_zlab_form, zlab_config
from engine.format import vllm_rules as vr
from engine.format.config import DraftConfig, field_default, register_config_type
from engine.format.report import Issue, ValidationReport

# the number of draft layers z-lab's DFlash trainer (and speculators') builds by default
DFLASH_DEFAULT_LAYERS = 5
MASK_HIDDEN_REFUSED = "DFlash embeds masked slots via mask_token_id; mask_hidden must not be in the checkpoint"


@register_config_type
class DFlashConfig(DraftConfig):
    """DFlash: a block of mask tokens denoised in one pass, with verifier features as extra K/V."""

    algorithm: ClassVar[str] = "dflash"
    default_architecture: ClassVar[str] = "DFlashSpeculator"
    config_class: ClassVar[str] = "DFlashSpeculatorConfig"
    uses_mask_token: ClassVar[bool] = True
    vllm_order: ClassVar[int] = 2
    vllm_refused_tensors: ClassVar[dict[str, str]] = {"mask_hidden": MASK_HIDDEN_REFUSED}
    token_id_fields: ClassVar[dict[str, str]] = {
        "mask_token_id": "a token id the target never emits (the tokenizer's mask or pad token, or a spare row)"}
    llamacpp_spec_type: ClassVar[str | None] = "draft-dflash"
    llamacpp_architecture: ClassVar[str] = "DFlashDraftModel"  # z-lab's layout, which llama.cpp's converter reads

    speculators_model_type: Literal["dflash"] = "dflash"
    block_size: int = Field(8, ge=2, description="Tokens per draft block (anchor + mask slots).")
    aux_hidden_state_layer_ids: list[int] | None = Field(None, description="Verifier layer ids fused by fc.")
    mask_token_id: int | None = Field(None, description="Token id placed in the mask slots of a block.")
    sliding_window_non_causal: bool = Field(False,
                                            description="Sliding-window layers are bidirectional inside a block.")
    sample_from_anchor: bool = Field(False,
                                     description="All block slots predict (True) or slot 0 is the anchor (False).")

    @classmethod
    def default_aux_layer_ids(cls, num_layers: int) -> list[int]:
        return evenly_spaced_layer_ids(num_layers)

    @classmethod
    def default_speculative_tokens(cls, fields: dict[str, Any]) -> int:
        """block_size - 1 (the anchor slot drafts nothing), block_size when every slot predicts."""
        block = field_default(cls, fields, "block_size")
        return block if field_default(cls, fields, "sample_from_anchor") else block - 1

    def max_speculative_tokens(self) -> int | None:
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    def k_limit_reason(self) -> str:
        return (f"a block of {self.block_size} with sample_from_anchor={self.sample_from_anchor} drafts at most "
                f"{self.max_speculative_tokens()} tokens")

    @classmethod
    def vllm_update(cls, cfg: dict, pre: dict) -> None:
        """`update_dflash` (speculators/algos.py)."""
        pre["architectures"] = ["DFlashDraftModel"]
        pre["draft_vocab_size"] = cfg.get("draft_vocab_size")
        if cfg.get("target_hidden_size") is not None:
            pre["target_hidden_size"] = cfg["target_hidden_size"]
        aux = vllm_aux_ids(cfg, pre)
        if "mask_token_id" not in cfg:
            raise vr.VllmError("KeyError", "'mask_token_id'", field="mask_token_id")
        pre["dflash_config"] = {
            "mask_token_id": cfg["mask_token_id"],
            "target_layer_ids": vllm_target_layer_ids(aux),
            "sample_from_anchor": cfg.get("sample_from_anchor", False),
            "causal": not cfg.get("sliding_window_non_causal", True),
        }

    @classmethod
    def vllm_parameters(cls, hf: dict, d: vr.Dims) -> tuple[dict[str, tuple], set[str]]:
        ids = hf.get("eagle_aux_hidden_state_layer_ids") or []
        a = len(ids) if ids else d.layers
        exp: dict[str, tuple] = {"fc.weight": (d.h, d.ht * a), "hidden_norm.weight": (d.h,), "norm.weight": (d.h,)}
        for i in range(d.layers):
            exp.update(vr.attn_mlp(f"layers.{i}.", d, d.h, qk_norm=True))
        return exp, set()

    @classmethod
    def validation_rules(cls) -> list:
        return [one_layer_type, explicit_causal_flag]

    @classmethod
    def llamacpp_problem(cls, cfg: dict[str, Any]) -> str | None:
        return form_problem(cfg)

    @classmethod
    def llamacpp_dflash_fields(cls, cfg: dict[str, Any]) -> dict[str, Any]:
        """This type's own fields in z-lab's `dflash_config` (none for DFlash)."""
        return {}

    @classmethod
    def write_llamacpp_form(cls, cfg: dict[str, Any], draft: Path, out: Path) -> Path:
        return write_zlab_form(zlab_config(cfg, cls.llamacpp_architecture, cls.llamacpp_dflash_fields(cfg)), draft,
                               out)


def vllm_aux_ids(cfg: dict, pre: dict) -> Any:
    """vLLM reads the DFlash family's aux ids from `aux_hidden_state_layer_ids` (a KeyError when absent)."""
    if "aux_hidden_state_layer_ids" not in cfg:
        raise vr.VllmError("KeyError", "'aux_hidden_state_layer_ids'", field="aux_hidden_state_layer_ids")
    pre["eagle_aux_hidden_state_layer_ids"] = cfg["aux_hidden_state_layer_ids"]
    return cfg["aux_hidden_state_layer_ids"]


def vllm_target_layer_ids(aux: Any) -> list[int]:
    try:
        return [i - 1 for i in aux]
    except TypeError as exc:
        raise vr.VllmError("TypeError", str(exc), field="aux_hidden_state_layer_ids") from None


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


def one_layer_type(cfg, typed, hf, report: ValidationReport) -> None:
    types = (cfg.get("transformer_layer_config") or {}).get("layer_types") \
        if isinstance(cfg.get("transformer_layer_config"), dict) else None
    if isinstance(types, list) and len(set(map(str, types))) > 1:
        report.add(Issue("transformer_layer_config.layer_types", "mixed sliding/full attention layers: vLLM's V1 "
                         "runner refuses mixed sliding/full dflash drafts; make all layers one type",
                         severity="warning"))


def explicit_causal_flag(cfg, typed, hf, report: ValidationReport) -> None:
    if "sliding_window_non_causal" not in cfg:
        report.add(Issue("sliding_window_non_causal", "missing: vLLM then serves the draft non-causal "
                         "(causal = not sliding_window_non_causal, default True); write it explicitly",
                         severity="warning"))
