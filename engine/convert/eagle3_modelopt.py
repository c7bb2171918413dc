"""EAGLE-3 as NVIDIA ModelOpt exports it (e.g. nvidia/*-Eagle3): `midlayer.*` (`midlayer.{i}.*` with several layers),
`fc`, `norm`, `lm_head`, `d2t` without `t2d`; `eagle_config` records the aux layer ids vLLM reads as they are."""

from __future__ import annotations

from typing import Any

from engine.convert.base import CONVERTERS, KeyRule
from engine.convert.eagle3_common import Eagle3Source

MODELOPT_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm",
                 "next_layer_regular", "parallel_draft_step")


def is_modelopt(config: dict[str, Any]) -> bool:
    eagle = config.get("eagle_config")
    return isinstance(eagle, dict) and any(k in eagle for k in MODELOPT_KEYS)


@CONVERTERS.register("eagle3-modelopt")
class Eagle3ModelOpt(Eagle3Source):
    name = "eagle3-modelopt"
    precedence = 10  # its eagle_config keys are unambiguous
    title = "EAGLE-3 NVIDIA ModelOpt export (eagle_config, midlayer.* / midlayer.{i}.*, d2t)"
    key_map = (
        KeyRule(r"midlayer\.(\d+)\.(.+)", r"layers.\1.\2", "decoder layer i of a multi-layer export"),
        KeyRule(r"midlayer\.(.+)", r"layers.0.\1", "the first decoder layer"),
        KeyRule(r"fc\.weight", r"fc.weight", "fuses the verifier's aux states [H, A*Ht]"),
        KeyRule(r"norm\.weight", r"norm.weight"),
        KeyRule(r"lm_head\.weight", r"lm_head.weight", "draft-vocabulary head (the base model's when it had none)"),
        KeyRule(r"d2t", "d2t", "draft id -> target id offsets (t2d is derived from it)"),
    )
    notes = (
        ("The aux layer ids come from eagle_config.eagle_aux_hidden_state_layer_ids: vLLM serves ModelOpt exports "
        "with these ids as they are, so they are kept unchanged."),
        "ModelOpt does not export t2d; it is derived from d2t (speculators needs it to reload the draft).",
    )

    def matches(self, config, index) -> bool:
        return is_modelopt(config)

    def recorded_aux_ids(self, config):
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return [int(i) for i in ids] if ids else None

    def transform(self, state, config, options):
        import torch

        out = super().transform(state, config, options)  # an identity d2t over the full vocabulary is dropped
        vocab = int(config["vocab_size"])
        if "d2t" in out and "t2d" not in out:
            t2d = torch.zeros(vocab, dtype=torch.bool)  # target id = draft id + d2t[draft id]
            t2d[torch.arange(out["d2t"].shape[0]) + out["d2t"]] = True
            out["t2d"] = t2d
        return out
