"""EAGLE-3 as SafeAILab/EAGLE trains it and its hub uploads publish it (yuhuili/EAGLE3-*): `midlayer.*`, `fc`, `norm`,
`lm_head`, `d2t`/`t2d`; a Llama config with `draft_vocab_size`, often `pytorch_model.bin`; no aux layer ids."""

from __future__ import annotations

from engine.convert.base import CONVERTERS, KeyRule
from engine.convert.eagle3_common import MIDLAYER_RULES, Eagle3Source, architectures, has_midlayer


@CONVERTERS.register("eagle3-safeailab")
class Eagle3SafeAILab(Eagle3Source):
    name = "eagle3-safeailab"
    precedence = 40
    title = "EAGLE-3 research checkpoint (SafeAILab/EAGLE and its hub uploads: midlayer.*, fc, d2t/t2d)"
    key_map = MIDLAYER_RULES + (
        KeyRule(r"target_model\..+", None, "the verifier's own weights (SafeAILab's training Model holds them)"),
    )
    notes = (
        ("The config does not record the verifier layers the draft reads: the target's defaults [2, N//2, N-3] "
        "apply unless you give the ids it was trained with (--aux-layer-ids)."),
        "SafeAILab's first layer adds the raw fc output to its residual (norm_before_residual false).",
        "Hub uploads are often pickled (pytorch_model.bin): they are read only with --allow-pickle.",
    )

    def matches(self, config, index) -> bool:
        return has_midlayer(index) or "Eagle3" in architectures(config)
