"""z-lab DFlash checkpoints: config with `dflash_config`; layer ids shifted by one; fused qkv split; extras dropped."""

from __future__ import annotations

from typing import Any

import torch

from engine.convert.base import CONVERTERS, Converter, ConvertOptions, KeyRule
from engine.errors import WorkbenchError
from engine.format.config import build_draft_config

_DROP_CONFIG = {"architectures", "auto_map", "block_size", "dflash_config", "num_target_layers", "torch_dtype",
                "dtype", "transformers_version", "_name_or_path"}
_LAYER_PARTS = (r"self_attn\.(?:q_proj|k_proj|v_proj|o_proj|qkv_proj|q_norm|k_norm)\.weight|"
                r"mlp\.(?:gate_proj|up_proj|down_proj)\.weight|input_layernorm\.weight|post_attention_layernorm\.weight")


@CONVERTERS.register("dflash-zlab")
class DFlashZLab(Converter):
    name = "dflash-zlab"
    title = "z-lab DFlash checkpoint (dflash_config with target_layer_ids read as hidden_states[id + 1])"
    algorithm = "dflash"
    options = ("mask_token_id", "aux_layer_ids", "speculative_tokens")
    key_map = (
        KeyRule(r"layers\.\d+\.self_attn\.g_proj\..+", None, "training-only gate of some z-lab variants"),
        KeyRule(r"aux_hidden_norms\..+", None, "training-only norms of some z-lab variants"),
        KeyRule(r"encoder\.output_norm_enc\.(.+)", r"hidden_norm.\1", "norm after fc (older name)"),
        KeyRule(r"encoder\.fc\.(.+)", r"fc.\1", "fuses the verifier's aux states (older name)"),
        KeyRule(r"(fc|hidden_norm|norm)\.weight", r"\1.weight"),
        KeyRule(rf"layers\.(\d+)\.({_LAYER_PARTS})", r"layers.\1.\2", "a fused qkv_proj is split into q/k/v"),
        KeyRule(r"embed_tokens\.weight", None, "the verifier's embedding: vLLM and speculators share it"),
        KeyRule(r"lm_head\.weight", None, "the verifier's full-vocabulary head: shared, not saved"),
    )
    notes = (
        ("z-lab numbers target layers by their output (`hidden_states[id + 1]`); the converted config records "
        "vLLM's ids (each one higher)."),
        "A fused `qkv_proj` is split into q/k/v; training-only gates and norms are dropped.",
    )

    def matches(self, config: dict[str, Any], index) -> bool:
        return "dflash_config" in config or any("DFlash" in a for a in config.get("architectures") or [])

    def transform(self, state, config, options):
        out: dict[str, torch.Tensor] = {}
        h = int(config["hidden_size"])
        nh = int(config["num_attention_heads"])
        hd = int(config.get("head_dim") or h // nh)
        kv = int(config.get("num_key_value_heads") or nh) * hd
        for name, t in super().transform(state, config, options).items():
            if ".qkv_proj." in name:  # fused [q; k; v] [(nh + 2 nkv) hd, H] -> separate projections
                if t.shape[0] != nh * hd + 2 * kv:
                    raise WorkbenchError(f"{name} has {t.shape[0]} rows, the config's heads need {nh * hd + 2 * kv}")
                q, k, v = t.split([nh * hd, kv, kv], dim=0)
                for part, tensor in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    out[name.replace("qkv_proj", part)] = tensor.contiguous()
                continue
            out[name] = t
        return out

    def aux_ids(self, config: dict[str, Any], num_layers: int | None, options: ConvertOptions) -> list[int]:
        if options.aux_layer_ids:
            return sorted(options.aux_layer_ids)  # given in vLLM's numbering
        ids = (config.get("dflash_config") or {}).get("target_layer_ids")
        if not ids:
            raise WorkbenchError("dflash_config.target_layer_ids is missing", hint="give --aux-layer-ids (vLLM "
                                 "numbering: id k = the input of layer k)")
        return [i + 1 for i in ids if num_layers is None or i + 1 != num_layers]

    def build_config(self, config, state, *, verifier, verifier_config, options: ConvertOptions) -> dict[str, Any]:
        n = config.get("num_target_layers") or (verifier_config or {}).get("num_hidden_layers")
        aux = self.aux_ids(config, n, options)
        h = int(config["hidden_size"])
        if "fc.weight" in state and state["fc.weight"].shape[1] > len(aux) * h:
            state["fc.weight"] = state["fc.weight"][:, : len(aux) * h].contiguous()  # as speculators slices it
        block = int(config.get("block_size") or (config.get("dflash_config") or {}).get("block_size") or 16)
        layer_config = {k: v for k, v in config.items() if k not in _DROP_CONFIG}
        layer_config.setdefault("model_type", "qwen3")
        mask = options.mask_token_id if options.mask_token_id is not None else \
            (config.get("dflash_config") or {}).get("mask_token_id")
        if mask is None:
            raise WorkbenchError("the source records no mask token (dflash_config.mask_token_id)",
                                 hint="give --mask-token-id (the id the draft was trained with)")
        cfg = build_draft_config(
            "dflash", verifier_config=verifier_config or {"architectures": []}, verifier_name=verifier,
            layer_config=layer_config, speculative_tokens=options.speculative_tokens or block - 1, block_size=block,
            draft_vocab_size=int(config["vocab_size"]), aux_hidden_state_layer_ids=aux, mask_token_id=mask,
            # z-lab blocks attend bidirectionally; vLLM serves causal = not sliding_window_non_causal
            sliding_window_non_causal=True,
        )
        return cfg.to_dict()
