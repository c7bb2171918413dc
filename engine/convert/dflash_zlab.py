"""z-lab DFlash checkpoints: config with `dflash_config`; layer ids shifted by one; fused qkv split; extras dropped."""

from __future__ import annotations

from typing import Any

import torch

from engine.convert.base import CONVERTERS, Converter
from engine.errors import WorkbenchError
from engine.format.config import build_draft_config

_DROP_CONFIG = {"architectures", "auto_map", "block_size", "dflash_config", "num_target_layers", "torch_dtype",
                "dtype", "transformers_version", "_name_or_path"}


@CONVERTERS.register("dflash-zlab")
class DFlashZLab(Converter):
    name = "dflash-zlab"
    description = "z-lab DFlash checkpoint (dflash_config with target_layer_ids read as hidden_states[id + 1])"
    algorithm = "dflash"
    notes = (
        "z-lab numbers target layers by their output (`hidden_states[id + 1]`); the converted config records "
        "vLLM's ids (each one higher).",
        "A fused `qkv_proj` is split into q/k/v; training-only gates and norms are dropped.",
    )

    def matches(self, config: dict[str, Any], names: list[str]) -> bool:
        return "dflash_config" in config or any("DFlash" in a for a in config.get("architectures") or [])

    def rename(self, name: str) -> str | None:
        if ".g_proj." in name or name.startswith("aux_hidden_norms."):
            return None  # training-only gates/norms of some z-lab variants
        for old, new in (("encoder.output_norm_enc", "hidden_norm"), ("encoder.fc", "fc")):
            if name.startswith(old):
                return new + name[len(old):]
        return name

    def transform(self, state, config, **options):
        out: dict[str, torch.Tensor] = {}
        h = int(config["hidden_size"])
        nh = int(config["num_attention_heads"])
        hd = int(config.get("head_dim") or h // nh)
        kv = int(config.get("num_key_value_heads") or nh) * hd
        for name, t in state.items():
            new = self.rename(name)
            if new is None:
                continue
            if ".qkv_proj." in new:  # fused [q; k; v] -> separate projections
                q, k, v = t.split([nh * hd, kv, kv], dim=0)
                for part, tensor in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                    out[new.replace("qkv_proj", part)] = tensor.contiguous()
                continue
            out[new] = t
        return out

    def aux_ids(self, config: dict[str, Any], num_layers: int | None) -> list[int]:
        ids = (config.get("dflash_config") or {}).get("target_layer_ids")
        if not ids:
            raise WorkbenchError("dflash_config.target_layer_ids is missing", hint="give the verifier layers the "
                                 "draft reads, as in the z-lab config")
        return [i + 1 for i in ids if num_layers is None or i + 1 != num_layers]

    def build_config(self, config, state, *, verifier, verifier_config, **_: Any) -> dict[str, Any]:
        n = config.get("num_target_layers") or (verifier_config or {}).get("num_hidden_layers")
        aux = self.aux_ids(config, n)
        h = int(config["hidden_size"])
        if "fc.weight" in state and state["fc.weight"].shape[1] > len(aux) * h:
            state["fc.weight"] = state["fc.weight"][:, : len(aux) * h].contiguous()
        block = int(config.get("block_size") or (config.get("dflash_config") or {}).get("block_size") or 16)
        layer_config = {k: v for k, v in config.items() if k not in _DROP_CONFIG}
        layer_config.setdefault("model_type", "qwen3")
        mask = (config.get("dflash_config") or {}).get("mask_token_id")
        cfg = build_draft_config(
            "dflash", verifier_config=verifier_config or {"architectures": []}, verifier_name=verifier,
            layer_config=layer_config, speculative_tokens=block - 1, block_size=block,
            draft_vocab_size=int(config["vocab_size"]), aux_hidden_state_layer_ids=aux, mask_token_id=mask,
            # z-lab blocks attend bidirectionally; vLLM serves causal = not sliding_window_non_causal
            sliding_window_non_causal=True,
        )
        return cfg.to_dict()
