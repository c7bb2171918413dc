"""What the P-EAGLE sources share: EAGLE-3's layout plus `mask_hidden` and the draft's own embedding table, and the
speculators `peagle` config (mask token, norm flag and depth read from what the source records, else options)."""

from __future__ import annotations

from typing import Any

from engine.convert.base import ConvertOptions, KeyRule
from engine.convert.eagle3_common import Eagle3Source
from engine.errors import WorkbenchError
from engine.format.config import config_type

MASK_HIDDEN_RULE = KeyRule(r"mask_hidden", "mask_hidden",
                           "the learned feature of every mask slot [1, 1, A*Ht], fused by fc like a real one")
OWN_EMBEDDING_RULE = KeyRule(r"embed_tokens\.weight", "embed_tokens.weight",
                             "the draft's own table [V, H]: its mask-token row is trained (vLLM keeps it)")
ROTARY_RULE = KeyRule(r"rotary_emb\..+", None, "RoPE tables, recomputed from the config")


class PEagleSource(Eagle3Source):
    """A P-EAGLE research layout: EAGLE-3's tensors and config, plus the parallel slots' mask token."""

    algorithm = "peagle"
    options = ("aux_layer_ids", "norm_before_residual", "mask_token_id", "speculative_tokens")
    precedence = 5  # mask_hidden tells P-EAGLE apart from the EAGLE-3 layouts that share its names
    mask_token_where = "the source has none"  # where this layout records its mask token (for the message)

    def recorded_mask_token(self, config: dict[str, Any]) -> int | None:
        """The token id of the parallel slots, where the source records it."""
        return None

    def recorded_norm_before_residual(self, config: dict[str, Any]) -> bool | None:
        return None

    def recorded_depths(self, config: dict[str, Any]) -> int | None:
        """The number of parallel depths K the draft was trained for, where the source records it."""
        return None

    def layer_family(self, config, state) -> str:
        return "qwen3" if any(k.endswith("self_attn.q_norm.weight") for k in state) else "llama"

    def algorithm_fields(self, config, options: ConvertOptions) -> dict[str, Any]:
        mask = options.mask_token_id if options.mask_token_id is not None else self.recorded_mask_token(config)
        if mask is None:
            raise WorkbenchError(f"the {self.title} records no mask token: {self.mask_token_where}",
                                 hint="give --mask-token-id (the token id its parallel slots were trained with)")
        vocab = config.get("vocab_size")
        if vocab and not 0 <= int(mask) < int(vocab):
            raise WorkbenchError(f"mask token id {mask} is outside the vocabulary (0..{int(vocab) - 1})",
                                 hint="give the --mask-token-id the draft was trained with")
        residual = options.norm_before_residual
        if residual is None:
            residual = self.recorded_norm_before_residual(config)
        return {"mask_token_id": int(mask), "norm_before_residual": bool(residual)}

    def default_speculative_tokens(self, config) -> int:
        return self.recorded_depths(config) or config_type(self.algorithm).default_speculative_tokens({})
