"""P-EAGLE: EAGLE-3's front end drafting the whole block in one forward, trained on COD-sampled depths (registered
as `peagle`). This module imports no torch: the model, I/O, objective and proposer load on first use.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, register_algorithm
from engine.algos.peagle.args import PEagleArgs
from engine.format.config import PEagleConfig


@register_algorithm
class PEagle(DraftAlgorithm):
    name = "peagle"
    title = "P-EAGLE"
    summary = ("One draft forward per step for K tokens: EAGLE-3's fused features with the last token, then K-1 "
               "mask slots (a learned feature and mask token), causal by depth.")
    config_class = PEagleConfig
    args_class = PEagleArgs

    def speculative_tokens(self, args: PEagleArgs) -> int:
        return args.speculative_tokens or args.num_depths

    def describe(self, args: PEagleArgs) -> str:
        vocab = f"draft vocab {args.draft_vocab_size}" if args.draft_vocab_size else "full vocab"
        return f"{self.title}, {args.num_layers} {args.draft_arch} layer(s), {vocab}, {args.num_depths} depths"

    def card_objective(self, args: PEagleArgs) -> str:
        return (f"{args.num_depths} depths per anchor (COD sampling r = {args.down_sample_ratio:g}, floor "
                f"{args.down_sample_ratio_min:g}), forward KL to the target's distribution")

    def build(self, target, args: PEagleArgs, *, aux_layer_ids, token_counts, seed, init_from=None):
        from engine.algos.peagle.io import build_peagle, load_peagle

        if init_from:
            draft = load_peagle(init_from, target)
        else:
            draft = build_peagle(
                target, aux_layer_ids=list(aux_layer_ids), draft_vocab_size=args.draft_vocab_size,
                token_counts=token_counts, num_layers=args.num_layers, draft_arch=args.draft_arch,
                speculative_tokens=self.speculative_tokens(args), norm_before_residual=args.norm_before_residual,
                norm_before_fc=args.norm_before_fc, fc_norm=args.fc_norm, norm_output=args.norm_output,
                sliding_window=args.sliding_window, mask_token_id=args.mask_token_id, seed=seed)
        draft.lm_head.weight.requires_grad_(args.train_lm_head)
        return draft

    def load(self, path, target=None, *, allow_pickle=False, dtype=None):
        import torch

        from engine.algos.peagle.io import load_peagle

        return load_peagle(path, target, allow_pickle=allow_pickle, dtype=dtype or torch.float32)

    def save(self, draft, path, *, dtype=None, config_updates=None):
        import torch

        from engine.algos.peagle.io import save_peagle

        return save_peagle(draft, path, dtype=dtype or torch.bfloat16, config_updates=config_updates)

    def collate(self, samples, layout, max_tokens, args: PEagleArgs):
        from engine.algos.peagle.train import collate

        return collate(samples, layout, max_tokens, num_depths=args.num_depths, ratio=args.down_sample_ratio,
                       ratio_min=args.down_sample_ratio_min, max_anchors=args.max_anchors)

    def objective(self, draft, verifier, args: PEagleArgs, device: str):
        from engine.algos.peagle.train import PEagleObjective

        return PEagleObjective(draft, verifier, num_depths=args.num_depths, device=device)

    def proposer(self, draft, **options):
        from engine.algos.peagle.proposer import PEagleProposer

        return PEagleProposer(draft, **options)

    def acceptance_counts(self, draft, aux, token_ids, k):
        from engine.algos.peagle.evaluate import acceptance_counts

        return acceptance_counts(draft, aux, token_ids, k)

    def acceptance_expectation(self, draft, aux, token_ids, target_logits, k, temperature):
        from engine.algos.peagle.evaluate import acceptance_expectation

        return acceptance_expectation(draft, aux, token_ids, target_logits, k, temperature)
