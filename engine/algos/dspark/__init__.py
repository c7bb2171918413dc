"""DSpark: DFlash's parallel block backbone with the anchor predicting too, a sequential Markov correction head and
a confidence head that cuts the block before verification (registered as `dspark`). This module imports no torch.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, register_algorithm
from engine.algos.dspark.args import DSparkArgs
from engine.format.config import DSparkConfig


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

    def speculative_tokens(self, args: DSparkArgs) -> int:
        return args.speculative_tokens or args.block_size

    def describe(self, args: DSparkArgs) -> str:
        head = f"{args.markov_head_type} Markov head r={args.markov_rank}" if args.markov_rank else "no Markov head"
        conf = ", confidence head" if args.enable_confidence_head else ""
        return f"{self.title}, {args.num_layers} Qwen3 layer(s), block {args.block_size}, {head}{conf}"

    def card_objective(self, args: DSparkArgs) -> str:
        return (f"{args.max_anchors} random anchor blocks per packed row, {args.ce_alpha:g} × CE on the data tokens "
                f"+ {args.tv_alpha:g} × total variation to the target's distribution + "
                f"{args.confidence_head_alpha:g} × the confidence head's BCE, slot i weighted "
                f"exp(−(i−1)/{args.dflash_decay_gamma:g})")

    def build(self, target, args: DSparkArgs, *, aux_layer_ids, token_counts, seed, init_from=None):
        from engine.algos.dspark.io import build_dspark, load_dspark

        if init_from:
            return load_dspark(init_from, target)
        return build_dspark(target, markov_rank=args.markov_rank, markov_head_type=args.markov_head_type,
                            enable_confidence_head=args.enable_confidence_head,
                            confidence_head_with_markov=args.confidence_head_with_markov,
                            block_size=args.block_size, aux_layer_ids=list(aux_layer_ids), num_layers=args.num_layers,
                            draft_vocab_size=args.draft_vocab_size, token_counts=token_counts,
                            sliding_window=args.sliding_window, block_causal=args.block_causal,
                            mask_token_id=args.mask_token_id, speculative_tokens=self.speculative_tokens(args),
                            seed=seed)

    def load(self, path, target=None, *, allow_pickle=False, dtype=None):
        import torch

        from engine.algos.dspark.io import load_dspark

        return load_dspark(path, target, allow_pickle=allow_pickle, dtype=dtype or torch.float32)

    def save(self, draft, path, *, dtype=None, config_updates=None):
        import torch

        from engine.algos.dspark.io import save_dspark

        return save_dspark(draft, path, dtype=dtype or torch.bfloat16, config_updates=config_updates)

    def collate(self, samples, layout, max_tokens, args: DSparkArgs):
        from engine.algos.dflash.train import collate
        from engine.errors import WorkbenchError

        if layout.last_column < 0:
            raise WorkbenchError("DSpark training needs the target's last layer in the data (its TV and confidence "
                                 "terms read the target's distribution)", hint="extract again with --algo dspark")
        return collate(samples, layout, max_tokens, block_size=args.block_size, max_anchors=args.max_anchors,
                       with_last=True)

    def objective(self, draft, verifier, args: DSparkArgs, device: str):
        from engine.algos.dspark.train import DSparkObjective

        return DSparkObjective(draft, verifier, gamma=args.dflash_decay_gamma, ce_alpha=args.ce_alpha,
                               tv_alpha=args.tv_alpha, conf_alpha=args.confidence_head_alpha, device=device)

    def calibrate(self, draft, objective, batches, args: DSparkArgs):
        from engine.algos.dspark.calibrate import calibrate

        return calibrate(draft, objective, batches, args.calibration_blocks)

    def proposer(self, draft, **options):
        from engine.algos.dspark.proposer import DSparkProposer

        return DSparkProposer(draft, **options)

    def acceptance_counts(self, draft, aux, token_ids, k):
        from engine.algos.dspark.evaluate import acceptance_counts

        return acceptance_counts(draft, aux, token_ids, k)

    def walk_counts(self, draft, aux, token_ids, k):
        """The counts with the static cut the proposer applies by default (its confidence_threshold)."""
        from engine.algos.dspark.args import DSparkProposerOptions
        from engine.algos.dspark.evaluate import counts_and_cuts

        return counts_and_cuts(draft, aux, token_ids, k, DSparkProposerOptions().confidence_threshold)

    def acceptance_expectation(self, draft, aux, token_ids, target_logits, k, temperature):
        from engine.algos.dspark.evaluate import acceptance_expectation

        return acceptance_expectation(draft, aux, token_ids, target_logits, k, temperature)
