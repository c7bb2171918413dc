"""EAGLE-3 drafts with Qwen3 decoder layers (Qwen3ForCausalLMEagle3, model_type qwen3): the `midlayer.*` layout plus
`self_attn.q_norm`/`k_norm`; vLLM serves them as Eagle3Qwen3ForCausalLM and honours top-level aux ids."""

from __future__ import annotations

from engine.convert.base import CONVERTERS
from engine.convert.eagle3_common import Eagle3Source, architectures, has_midlayer


@CONVERTERS.register("eagle3-qwen3")
class Eagle3Qwen3(Eagle3Source):
    name = "eagle3-qwen3"
    precedence = 20
    title = "EAGLE-3 checkpoint with Qwen3 layers (midlayer.* with q_norm/k_norm)"
    draft_arch = "qwen3"
    notes = (
        ("The draft keeps its Qwen3 layers (q_norm/k_norm); the converted transformer_layer_config has model_type "
        "qwen3, which vLLM serves with its Qwen3 EAGLE-3 class."),
        ("Aux layer ids are read from eagle_config.eagle_aux_hidden_state_layer_ids (or the top-level field) when "
        "the config records them."),
    )

    def matches(self, config, index) -> bool:
        qk_norm = "midlayer.self_attn.q_norm.weight" in index
        return "Qwen3ForCausalLMEagle3" in architectures(config) or (has_midlayer(index) and (
            qk_norm or config.get("model_type") == "qwen3"))

    def recorded_aux_ids(self, config):
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or \
            config.get("eagle_aux_hidden_state_layer_ids")
        return [int(i) for i in ids] if ids else None
