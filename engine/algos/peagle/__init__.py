"""P-EAGLE: EAGLE-3's front end drafting the whole block in one forward, trained on COD-sampled depths (registered
as `peagle`). This module imports no torch: the model, I/O, objective and proposer are found by convention
(engine/algos/base.py) and load on first use.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, register_algorithm
from engine.algos.peagle.args import PEagleArgs
from engine.algos.peagle.config import PEagleConfig


@register_algorithm
class PEagle(DraftAlgorithm):
    name = "peagle"
    p_min_cut = True
    title = "P-EAGLE"
    summary = ("One draft forward per step for K tokens: EAGLE-3's fused features with the last token, then K-1 "
               "mask slots (a learned feature and mask token), causal by depth.")
    config_class = PEagleConfig
    args_class = PEagleArgs

    def describe(self, args: PEagleArgs) -> str:
        vocab = f"draft vocab {args.draft_vocab_size}" if args.draft_vocab_size else "full vocab"
        return f"{self.title}, {args.num_layers} {args.draft_arch} layer(s), {vocab}, {args.num_depths} depths"

    def card_objective(self, args: PEagleArgs) -> str:
        return (f"{args.num_depths} depths per anchor (COD sampling r = {args.down_sample_ratio:g}, floor "
                f"{args.down_sample_ratio_min:g}), forward KL to the target's distribution")
