"""EAGLE-3 research checkpoints (SafeAILab/yuhuili, NVIDIA Eagle3): `midlayer.*` -> `layers.0.*`, config rebuilt."""

from __future__ import annotations

from typing import Any

import torch

from engine.convert.base import CONVERTERS, Converter
from engine.errors import WorkbenchError
from engine.format.config import build_draft_config, build_layer_config


@CONVERTERS.register("eagle3-research")
class Eagle3Research(Converter):
    name = "eagle3-research"
    description = "EAGLE-3 research checkpoint (SafeAILab / NVIDIA layout: midlayer.*, fc, d2t/t2d)"
    algorithm = "eagle3"
    notes = (
        "The converted config.json is a speculators `eagle3` config: `transformer_layer_config` from this "
        "config, `speculators_config.verifier` naming the target (hub id), `draft_vocab_size` from `d2t`.",
        "Research checkpoints do not record their aux layer ids: the target's defaults [2, N//2, N-3] apply "
        "unless you know the ones it was trained with.",
    )
    _LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                   "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling",
                   "rope_parameters", "attention_bias", "mlp_bias")

    def matches(self, config: dict[str, Any], names: list[str]) -> bool:
        archs = " ".join(config.get("architectures") or [])
        return any(n.startswith("midlayer.") for n in names) or "Eagle3" in archs or "eagle3" in archs.lower()

    def rename(self, name: str) -> str | None:
        if name.startswith("midlayer."):
            return "layers.0." + name[len("midlayer."):]
        return name

    def build_config(self, config, state, *, verifier, verifier_config, aux_layer_ids=None,
                     norm_before_residual: bool = False, speculative_tokens: int = 3, **_: Any) -> dict[str, Any]:
        if "fc.weight" not in state:
            raise WorkbenchError("no fc.weight: this is not an EAGLE-3 draft (EAGLE-1/2 drafts are not supported)")
        layer = {k: config[k] for k in self._LLAMA_KEYS if config.get(k) is not None}
        if "rope_parameters" not in layer and "rope_theta" in layer:
            params = dict(layer.pop("rope_scaling", None) or {})
            params.setdefault("rope_type", params.pop("type", "default"))
            params["rope_theta"] = layer.pop("rope_theta")
            layer["rope_parameters"] = params
        layer.pop("rope_theta", None)
        layer.pop("rope_scaling", None)
        vocab = int(state["t2d"].shape[0]) if "t2d" in state else int(
            (verifier_config or {}).get("vocab_size") or config.get("vocab_size"))
        layer["vocab_size"] = vocab
        if verifier_config and verifier_config.get("max_position_embeddings"):
            layer["max_position_embeddings"] = max(int(layer.get("max_position_embeddings", 0)),
                                                   int(verifier_config["max_position_embeddings"]))
        num_layers = 1 + max((int(k.split(".")[1]) for k in state if k.startswith("layers.")), default=0)
        layer_config = build_layer_config(layer, model_type="llama", num_layers=num_layers, sliding_window=None)
        h = int(layer["hidden_size"])
        fc_in = int(state["fc.weight"].shape[1])
        ht = int((verifier_config or {}).get("hidden_size") or h)
        fields: dict[str, Any] = {
            "draft_vocab_size": int(config.get("draft_vocab_size") or state["lm_head.weight"].shape[0]),
            "norm_before_residual": norm_before_residual,
            "norm_before_fc": "input_norm.weight" in state,
            "fc_norm": any(k.startswith("fc_norm.") for k in state),
        }
        if aux_layer_ids:
            fields["eagle_aux_hidden_state_layer_ids"] = sorted(aux_layer_ids)
        if ht != h:
            fields["target_hidden_size"] = ht
        if fc_in % ht:
            raise WorkbenchError(f"fc.weight has {fc_in} inputs, not a multiple of the target hidden size {ht}")
        if fc_in // ht != 3:
            layer_config["num_aux_hidden_states"] = fc_in // ht
        cfg = build_draft_config("eagle3", verifier_config=verifier_config or {"architectures": []},
                                 verifier_name=verifier, layer_config=layer_config,
                                 speculative_tokens=speculative_tokens, **fields)
        return cfg.to_dict()

    def transform(self, state, config, **options):
        out = super().transform(state, config, **options)
        if "d2t" in out:
            out["d2t"] = out["d2t"].long()
        if "t2d" in out:
            out["t2d"] = out["t2d"].bool()
        return out
