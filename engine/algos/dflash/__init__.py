"""DFlash: a parallel block drafter, [anchor, MASK x (B-1)] denoised in one forward over injected target features
(registered as `dflash`). This module imports no torch: the model, I/O, objective and proposer are found by
convention (engine/algos/base.py) and load on first use.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, register_algorithm
from engine.algos.dflash.args import DFlashArgs
from engine.algos.dflash.config import DFlashConfig


@register_algorithm
class DFlash(DraftAlgorithm):
    name = "dflash"
    title = "DFlash"
    summary = ("One draft forward per step for a whole block: the last token and B-1 mask slots attend to the "
               "target's fused features of every committed position; its cost does not grow with k.")
    config_class = DFlashConfig
    published_data = ("about 800K regenerated samples (the DFlash paper, as DFlare's abstract puts it)", 800_000)
    args_class = DFlashArgs
    needs_last_layer = False  # hard-label CE needs only the tokens; the KL loss reads the last layer when present

    def describe(self, args: DFlashArgs) -> str:
        return f"{self.title}, {args.num_layers} Qwen3 layer(s), block {args.block_size}, {args.loss_fn} loss"

    def card_model_lines(self, config, args: DFlashArgs) -> list[str]:
        tl = config.get("transformer_layer_config") or {}
        attention = "causal" if args.block_causal else "bidirectional"
        return [f"- {tl.get('num_hidden_layers', args.num_layers)} Qwen3 decoder layers (hidden "
                f"{tl.get('hidden_size', '?')}); the target's layers {config.get('aux_hidden_state_layer_ids', '?')} "
                "fused by `fc` into every layer's keys and values; block of "
                f"{config.get('block_size', args.block_size)} (the last token and mask token "
                f"{config.get('mask_token_id', '?')} in the other slots), {attention} inside the block; the "
                "target's embedding and `lm_head` (not stored).",
                f"- `speculative_tokens` = {self.speculative_tokens(args)} (up to block − 1 per draft forward). "
                "Weights in bf16."]

    def card_objective(self, args: DFlashArgs) -> str:
        loss = "hard-label cross-entropy on the data tokens" if args.loss_fn == "ce" else \
            "forward KL to the target's distribution"
        return (f"{args.max_anchors} random anchor blocks per packed row, {loss}, slot i weighted "
                f"exp(−(i−1)/{args.dflash_decay_gamma:g})")

    def collate_options(self, args: DFlashArgs, layout) -> dict:
        return {"with_last": args.loss_fn == "kl" and layout.last_column >= 0}  # the KL loss reads the last layer
