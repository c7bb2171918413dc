"""DFlash2 (experimental in speculators 0.9.0): DFlash's parallel block drafter with grouped dynamic causal
convolutions and a candidate selector that rescores each slot's top-k given the previous token (registered as
`dflash2`). A DFlash family member: this module imports no torch."""

from __future__ import annotations

from engine.algos.base import register_algorithm
from engine.algos.dflash import DFlash
from engine.algos.dflash2.args import DFlash2Args
from engine.algos.dflash2.config import DFlash2Config


@register_algorithm
class DFlash2(DFlash):
    name = "dflash2"
    title = "DFlash2"
    summary = ("DFlash's one forward per block, with dynamic convolutions over neighbouring slots in every layer; "
               "a low-rank selector then picks each slot's token among its top-k candidates given the token "
               "drafted before it.")
    config_class = DFlash2Config
    published_data = None
    args_class = DFlash2Args
    needs_last_layer = True  # the default KL loss (and the selector's targets) read the target's distribution

    def describe(self, args: DFlash2Args) -> str:
        return (f"{self.title}, {args.num_layers} Qwen3 layer(s), block {args.block_size}, selector rank "
                f"{args.selector_rank} top-{args.selector_top_k}, {args.loss_fn} loss")

    def card_model_lines(self, config, args: DFlash2Args) -> list[str]:
        lines = super().card_model_lines(config, args)
        lines.insert(1, f"- Around every layer's attention and MLP a grouped dynamic causal convolution "
                        f"({config.get('conv_kernel_size', args.conv_kernel_size)} taps, "
                        f"{config.get('conv_group_size', args.conv_group_size)} channels per kernel); a candidate "
                        f"selector (rank {config.get('selector_rank', args.selector_rank)}) rescores the top "
                        f"{config.get('selector_top_k', args.selector_top_k)} tokens of each slot given the token "
                        "before it.")
        return lines

    def card_objective(self, args: DFlash2Args) -> str:
        target = "the target's argmax" if args.loss_fn == "kl" else "the data token"
        return (f"{super().card_objective(args)}, plus {args.selector_loss_alpha:g} × the selector's "
                f"{args.selector_top_k}-way cross-entropy toward {target} (injected as the last candidate when the "
                "unary top-k misses it)")

    def collate_options(self, args: DFlash2Args, layout) -> dict:
        return {"with_last": args.loss_fn == "kl"}  # the KL loss and its selector targets read the last layer
