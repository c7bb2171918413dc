"""P-EAGLE as the AWS hub models publish it (amazon/*-P-EAGLE, served by vLLM as eagle3 + parallel_drafting):
`midlayer.*` then `layers.{i}.*`, `mask_hidden`, its own `embed_tokens`, `d2t`/`t2d`, and `ptd_token_id` in a
Llama config that records no aux layer ids."""

from __future__ import annotations

from engine.convert.base import CONVERTERS
from engine.convert.eagle3_common import MIDLAYER_RULES, has_midlayer
from engine.convert.peagle_common import MASK_HIDDEN_RULE, OWN_EMBEDDING_RULE, ROTARY_RULE, PEagleSource

# the config fields vLLM's parallel-drafting proposer reads the mask token from (in its order after mask_token_id)
MASK_TOKEN_FIELDS = ("mask_token_id", "pard_token", "ptd_token_id")


@CONVERTERS.register("peagle-aws")
class PEagleAWS(PEagleSource):
    name = "peagle-aws"
    mask_token_where = "its config.json has no ptd_token_id, pard_token or mask_token_id"
    precedence = 4  # before SpecForge's: a vLLM-layout draft named layers.0.* still records ptd_token_id
    title = "P-EAGLE checkpoint in vLLM's parallel-drafting layout (AWS hub models: midlayer.*, mask_hidden, " \
            "ptd_token_id)"
    key_map = (OWN_EMBEDDING_RULE, MASK_HIDDEN_RULE, *MIDLAYER_RULES, ROTARY_RULE)
    notes = (
        ("The mask token is the config's ptd_token_id (or pard_token); the converted config records it as "
         "mask_token_id, which vLLM turns back into pard_token."),
        ("The config records no aux layer ids: vLLM reads the verifier's defaults [2, N//2, N-3], and so does the "
         "converted config (give --aux-layer-ids if the draft was trained on others)."),
        ("The config does not record the depths K it was trained for (the model card does, e.g. 10 for "
         "GPT-OSS-20B): speculative_tokens defaults to 8; give --speculative-tokens."),
    )

    def matches(self, config, index) -> bool:
        # a parallel-drafting token alone is not enough: PARD's full draft models record pard_token too (no fc)
        recorded = "fc.weight" in index and any(f in config for f in MASK_TOKEN_FIELDS[1:])
        return ("mask_hidden" in index and has_midlayer(index)) or recorded

    def recorded_mask_token(self, config):
        return next((int(config[f]) for f in MASK_TOKEN_FIELDS if config.get(f) is not None), None)

    def recorded_norm_before_residual(self, config):
        return config.get("norm_before_residual")  # vLLM's EAGLE-3 layer: False when absent

    def recorded_aux_ids(self, config):
        ids = config.get("eagle_aux_hidden_state_layer_ids") or \
            (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return [int(i) for i in ids] if ids else None  # vLLM reads them as they are
