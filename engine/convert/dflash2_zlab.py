"""z-lab DFlash2 checkpoints (`DFlash2DraftModel`): DFlash's z-lab layout plus per-layer `attention_conv`/`mlp_conv`
and the `candidate_selector`, with the DFlash2 settings and z-lab's output scaling inside `dflash_config`."""

from __future__ import annotations

from typing import Any

import torch

from engine.convert.base import CONVERTERS, ConvertOptions, KeyRule
from engine.convert.dflash_zlab import _DROP_CONFIG, DFlashZLab
from engine.errors import WorkbenchError
from engine.format.config import build_draft_config
from engine.format.vllm_rules import RULES_LABEL

_CONV = r"(attention_conv|mlp_conv)\.(base_kernel|kernel_projection\.weight)"
_SELECTOR_DEFAULT_TOP_K = 16  # speculators' and z-lab's default when the source does not record it


@CONVERTERS.register("dflash2-zlab")
class DFlash2ZLab(DFlashZLab):
    name = "dflash2-zlab"
    precedence = 20  # before z-lab's DFlash, whose config also has a dflash_config
    title = "z-lab DFlash2 checkpoint (DFlash2DraftModel: convolutions and a candidate selector; dflash_config)"
    algorithm = "dflash2"
    key_map = (
        KeyRule(rf"layers\.(\d+)\.{_CONV}", r"layers.\1.\2.\3", "grouped dynamic causal convolution"),
        KeyRule(r"candidate_selector\.(predecessor_codebook|successor_codebook)(?:\.weight)?",
                r"candidate_selector.\1", "selector codebook [V, r] (an Embedding's `.weight` suffix dropped)"),
        KeyRule(r"candidate_selector\.hidden_projection\.weight", r"candidate_selector.hidden_projection.weight",
                "selector's hidden projection [r, H]"),
        *DFlashZLab.key_map,
    )
    notes = (
        *DFlashZLab.notes,
        ("z-lab's `output_multiplier` m (unary logits = m · head(norm(x))) has no speculators field: it is folded "
         "into `norm.weight` (× m) and the selector's `hidden_projection` (÷ m), which computes the same drafts."),
        (f"`final_logit_softcapping` and `input_embedding_scale` cannot be folded (the embedding and head are the "
         f"verifier's) and {RULES_LABEL}'s speculators path does not carry them: such a checkpoint is refused."),
    )

    def matches(self, config: dict[str, Any], index) -> bool:
        dc = config.get("dflash_config") or {}
        return any("DFlash2" in a for a in config.get("architectures") or []) or "selector_rank" in dc or any(
            name.startswith("candidate_selector.") for name in index)

    def transform(self, state, config, options):
        out = super().transform(state, config, options)
        m = float((config.get("dflash_config") or {}).get("output_multiplier") or 1.0)
        if m <= 0:
            raise WorkbenchError(f"dflash_config.output_multiplier is {m}: a non-positive scale changes which tokens "
                                 "are the top-k", hint="this checkpoint cannot be converted")
        if m != 1.0 and "norm.weight" in out and "candidate_selector.hidden_projection.weight" in out:
            out["norm.weight"] = (out["norm.weight"].float() * m).to(out["norm.weight"].dtype)
            w = out["candidate_selector.hidden_projection.weight"]
            out["candidate_selector.hidden_projection.weight"] = (w.float() / m).to(w.dtype)
        return out

    def build_config(self, config, state, *, verifier, verifier_config, options: ConvertOptions) -> dict[str, Any]:
        dc = config.get("dflash_config") or {}
        for key, neutral in (("final_logit_softcapping", 0.0), ("input_embedding_scale", 1.0)):
            if float(dc.get(key) or neutral) != neutral:
                raise WorkbenchError(f"dflash_config.{key} is {dc[key]}: the speculators format has no such field "
                                     f"and {RULES_LABEL} drops it when it builds the draft from a speculators "
                                     "config, so the converted draft would draft differently",
                                     hint="serve the z-lab checkpoint as it is, or retrain with the workbench "
                                          "(python -m engine train --algo dflash2)")
        n = config.get("num_target_layers") or (verifier_config or {}).get("num_hidden_layers")
        aux = self.aux_ids(config, n, options)
        h = int(config["hidden_size"])
        taps, rank, groups = _shapes(state, h)
        block = int(dc.get("block_size") or config.get("block_size") or 16)
        mask = options.mask_token_id if options.mask_token_id is not None else dc.get("mask_token_id")
        if mask is None:
            raise WorkbenchError("the source records no mask token (dflash_config.mask_token_id)",
                                 hint="give --mask-token-id (the id the draft was trained with)")
        layer_config = {k: v for k, v in config.items() if k not in _DROP_CONFIG | {"is_causal", "use_cache"}}
        layer_config.setdefault("model_type", "qwen3")
        cfg = build_draft_config(
            "dflash2", verifier_config=verifier_config or {"architectures": []}, verifier_name=verifier,
            layer_config=layer_config, speculative_tokens=options.speculative_tokens or block - 1, block_size=block,
            draft_vocab_size=int(config["vocab_size"]), aux_hidden_state_layer_ids=aux, mask_token_id=mask,
            sample_from_anchor=False, sliding_window_non_causal=not bool(config.get("is_causal", False)),
            conv_kernel_size=int(dc.get("conv_kernel_size") or taps), conv_group_size=int(dc.get("conv_group_size")
                                                                                         or h // groups),
            selector_rank=int(dc.get("selector_rank") or rank),
            selector_top_k=int(dc.get("selector_top_k") or _SELECTOR_DEFAULT_TOP_K),
        )
        return cfg.to_dict()


def _shapes(state: dict[str, torch.Tensor], hidden: int) -> tuple[int, int, int]:
    """(taps, selector rank, channel groups) read from the tensors, for a source config that omits them
    (speculators' defaults where a tensor is missing: the tensor check then names it)."""
    base = state.get("layers.0.attention_conv.base_kernel")
    projection = state.get("layers.0.attention_conv.kernel_projection.weight")
    codebook = state.get("candidate_selector.predecessor_codebook")
    taps = int(base.shape[1]) if base is not None and base.dim() == 3 else 2
    groups = int(projection.shape[0]) // (2 * taps) if projection is not None else hidden // 16
    return taps, int(codebook.shape[1]) if codebook is not None else 256, max(groups, 1)
