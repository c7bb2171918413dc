"""EAGLE-3 as SpecForge (SGLang) saves it: SafeAILab's `midlayer.*` names, its own `embed_tokens`, safetensors via
save_pretrained, a Llama config with `draft_vocab_size` and optionally `target_hidden_size`."""

from __future__ import annotations

from engine.convert.base import CONVERTERS
from engine.convert.eagle3_common import Eagle3Source, architectures, has_midlayer


@CONVERTERS.register("eagle3-specforge")
class Eagle3SpecForge(Eagle3Source):
    name = "eagle3-specforge"
    precedence = 30
    title = "EAGLE-3 SpecForge checkpoint (LlamaForCausalLMEagle3: midlayer.* with its own embed_tokens)"
    notes = (
        ("SpecForge's config does not record the verifier layers the draft reads: the target's defaults apply "
        "unless you give the ids it was trained with (--aux-layer-ids)."),
        "`fc` reads 3 x target_hidden_size when the config sets it (a verifier wider than the draft).",
    )

    def matches(self, config, index) -> bool:
        # SpecForge's draft owns `embed_tokens` and is written with save_pretrained (safetensors headers exist);
        # SafeAILab uploads are mostly pickles. Both map the same way, only the notes differ.
        return has_midlayer(index) and "embed_tokens.weight" in index and "LlamaForCausalLMEagle3" in \
            architectures(config)
