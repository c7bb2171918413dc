"""EAGLE-3: a chain drafter over fused target features, trained with training-time test (registered as `eagle3`).

This module imports no torch: the model, checkpoint I/O, objective and proposer are found by convention
(engine/algos/base.py) and load on first use.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, register_algorithm
from engine.algos.eagle3.args import Eagle3Args
from engine.algos.eagle3.config import Eagle3Config


@register_algorithm
class Eagle3(DraftAlgorithm):
    name = "eagle3"
    p_min_cut = True
    title = "EAGLE-3"
    summary = ("One draft forward per token: fused target features of the last verified position plus the token "
               "embedding, then the draft's own hidden state for the following tokens.")
    config_class = Eagle3Config
    published_data = ("ShareGPT + UltraChat", 530_000)
    args_class = Eagle3Args

    def describe(self, args: Eagle3Args) -> str:
        vocab = f"draft vocab {args.draft_vocab_size}" if args.draft_vocab_size else "full vocab"
        return f"{self.title}, {args.num_layers} {args.draft_arch} layer(s), {vocab}, {args.ttt_steps} TTT steps"

    def card_model_lines(self, config, args: Eagle3Args) -> list[str]:
        tl = config.get("transformer_layer_config") or {}
        plural = "s" if args.num_layers != 1 else ""
        return [f"- {args.num_layers} {args.draft_arch.capitalize()} decoder layer{plural} "
                "over the target's layers "
                f"{config.get('eagle_aux_hidden_state_layer_ids', '?')} (fused by `fc`), hidden "
                f"{tl.get('hidden_size', '?')}; draft vocabulary {config.get('draft_vocab_size', '?')} of "
                f"{tl.get('vocab_size', '?')} tokens (the most frequent assistant tokens, `d2t`/`t2d`); "
                + ("the token embedding is a frozen copy of the target's, stored so that speculators 0.9.0 loads "
                   "the draft as vLLM runs it." if args.save_embeddings else
                   "the token embedding is the target's (not stored: speculators 0.9.0 fills it with random values)."),
                f"- `norm_before_fc`, `norm_before_residual`, `norm_output` as speculators 0.9.0's trainer defaults; "
                f"`speculative_tokens` = {self.speculative_tokens(args)}. Weights in bf16."]

    def card_objective(self, args: Eagle3Args) -> str:
        return f"training-time test with {args.ttt_steps} steps, forward KL to the target's distribution"

    def prepare(self, draft, args: Eagle3Args):
        draft.save_embeddings = args.save_embeddings  # read by save(): the trainer passes no arguments there
        return super().prepare(draft, args)

    def save_options(self, draft) -> dict:
        return {"include_embeddings": getattr(draft, "save_embeddings", True)}
