"""DSpark: DFlash's parallel block backbone with the anchor predicting too, a sequential Markov correction head and
a confidence head that cuts the block before verification (registered as `dspark`). This module imports no torch.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, check_p_min, register_algorithm
from engine.algos.dspark.args import DSparkArgs, DSparkProposerOptions
from engine.algos.dspark.config import DSparkConfig


@register_algorithm
class DSpark(DraftAlgorithm):
    name = "dspark"
    title = "DSpark"
    summary = ("One backbone forward per step for a whole block (every slot drafts), then a tiny left-to-right "
               "Markov head corrects each token given the previous one, and a confidence head cuts the block "
               "where its survival probability drops, so fewer doomed tokens are verified.")
    config_class = DSparkConfig
    args_class = DSparkArgs
    needs_last_layer = True  # the TV and confidence terms read the target's distribution

    def describe(self, args: DSparkArgs) -> str:
        head = f"{args.markov_head_type} Markov head r={args.markov_rank}" if args.markov_rank else "no Markov head"
        conf = ", confidence head" if args.enable_confidence_head else ""
        layers = {"auto": "Qwen3 or Gemma 4 (as the target)", "qwen3": "Qwen3", "gemma4": "Gemma 4"}[args.draft_layout]
        return f"{self.title}, {args.num_layers} {layers} layer(s), block {args.block_size}, {head}{conf}"

    def card_objective(self, args: DSparkArgs) -> str:
        return (f"{args.max_anchors} random anchor blocks per packed row, {args.ce_alpha:g} × CE on the data tokens "
                f"+ {args.tv_alpha:g} × total variation to the target's distribution + "
                f"{args.confidence_head_alpha:g} × the confidence head's BCE, slot i weighted "
                f"exp(−(i−1)/{args.dflash_decay_gamma:g})")

    def calibrate(self, draft, objective, batches, args: DSparkArgs):
        from engine.algos.dspark.calibrate import calibrate

        return calibrate(draft, objective, batches, args.calibration_blocks)

    def walk_counts(self, draft, aux, token_ids, k, p_min=None):
        """The counts with the static cut the proposer applies by default (its confidence_threshold)."""
        from engine.algos.dspark.evaluate import counts_and_cuts

        check_p_min(self, p_min)
        return counts_and_cuts(draft, aux, token_ids, k, DSparkProposerOptions().confidence_threshold)
