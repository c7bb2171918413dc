"""EAGLE-3: a chain drafter over fused target features, trained with training-time test (registered as `eagle3`).

This module imports no torch: the model, checkpoint I/O, objective and proposer load on first use.
"""

from __future__ import annotations

from engine.algos.base import DraftAlgorithm, register_algorithm
from engine.algos.eagle3.args import Eagle3Args
from engine.format.config import Eagle3Config


@register_algorithm
class Eagle3(DraftAlgorithm):
    name = "eagle3"
    title = "EAGLE-3"
    summary = ("One draft forward per token: fused target features of the last verified position plus the token "
               "embedding, then the draft's own hidden state for the following tokens.")
    config_class = Eagle3Config
    published_data = ("ShareGPT + UltraChat", 530_000)
    args_class = Eagle3Args

    def speculative_tokens(self, args: Eagle3Args) -> int:
        return args.speculative_tokens or args.ttt_steps

    def describe(self, args: Eagle3Args) -> str:
        vocab = f"draft vocab {args.draft_vocab_size}" if args.draft_vocab_size else "full vocab"
        return f"{self.title}, {args.num_layers} {args.draft_arch} layer(s), {vocab}, {args.ttt_steps} TTT steps"

    def card_model_lines(self, config, args: Eagle3Args) -> list[str]:
        tl = config.get("transformer_layer_config") or {}
        return [f"- {args.num_layers} {args.draft_arch.capitalize()} decoder layer(s) over the target's layers "
                f"{config.get('eagle_aux_hidden_state_layer_ids', '?')} (fused by `fc`), hidden "
                f"{tl.get('hidden_size', '?')}; draft vocabulary {config.get('draft_vocab_size', '?')} of "
                f"{tl.get('vocab_size', '?')} tokens (the most frequent assistant tokens, `d2t`/`t2d`); the token "
                "embedding is the target's (not stored).",
                f"- `norm_before_fc`, `norm_before_residual`, `norm_output` as speculators 0.9.0's trainer defaults; "
                f"`speculative_tokens` = {self.speculative_tokens(args)}. Weights in bf16."]

    def card_objective(self, args: Eagle3Args) -> str:
        return f"training-time test with {args.ttt_steps} steps, forward KL to the target's distribution"

    def build(self, target, args: Eagle3Args, *, aux_layer_ids, token_counts, seed, init_from=None):
        from engine.algos.eagle3.io import build_eagle3, load_eagle3

        if init_from:
            draft = load_eagle3(init_from, target)
        else:
            draft = build_eagle3(
                target, aux_layer_ids=aux_layer_ids, draft_vocab_size=args.draft_vocab_size,
                token_counts=token_counts, num_layers=args.num_layers, draft_arch=args.draft_arch,
                speculative_tokens=self.speculative_tokens(args), norm_before_residual=args.norm_before_residual,
                norm_before_fc=args.norm_before_fc, fc_norm=args.fc_norm, norm_output=args.norm_output,
                sliding_window=args.sliding_window, seed=seed)
        draft.lm_head.weight.requires_grad_(args.train_lm_head)
        draft.save_embeddings = args.save_embeddings  # read by save(): the trainer passes no arguments there
        return draft

    def load(self, path, target=None, *, allow_pickle=False, dtype=None):
        import torch

        from engine.algos.eagle3.io import load_eagle3

        return load_eagle3(path, target, allow_pickle=allow_pickle, dtype=dtype or torch.float32)

    def save(self, draft, path, *, dtype=None, config_updates=None):
        import torch

        from engine.algos.eagle3.io import save_eagle3

        return save_eagle3(draft, path, dtype=dtype or torch.bfloat16, config_updates=config_updates,
                           include_embeddings=getattr(draft, "save_embeddings", True))

    def collate(self, samples, layout, max_tokens, args):
        from engine.algos.eagle3.train import collate

        return collate(samples, layout, max_tokens)

    def objective(self, draft, verifier, args: Eagle3Args, device: str):
        from engine.algos.eagle3.train import Eagle3Objective

        return Eagle3Objective(draft, verifier, steps=args.ttt_steps, decay=args.ttt_step_loss_decay, device=device)

    def proposer(self, draft, **options):
        from engine.algos.eagle3.proposer import Eagle3Proposer

        return Eagle3Proposer(draft, **options)

    def acceptance_counts(self, draft, aux, token_ids, k):
        from engine.algos.eagle3.evaluate import acceptance_counts

        return acceptance_counts(draft, aux, token_ids, k)

    def acceptance_expectation(self, draft, aux, token_ids, target_logits, k, temperature):
        from engine.algos.eagle3.evaluate import acceptance_expectation

        return acceptance_expectation(draft, aux, token_ids, target_logits, k, temperature)
