"""A toy draft algorithm in one folder: a linear head over the fused target states that drafts one token.

It exists to prove the algorithm interface: registered from outside the tree (WORKBENCH_ALGO_PLUGINS), it is
trained by `python -m engine train --algo toy`, listed in `--help` and in the Train form, saved, reloaded and
used by `generate` without any other file of the workbench changing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.algos import AlgoArgs, DraftAlgorithm, register_algorithm
from engine.format.config import DraftConfig


class ToyConfig(DraftConfig):
    algorithm = "toy"
    speculators_model_type: Literal["toy"] = "toy"
    aux_hidden_state_layer_ids: list[int] | None = None

    def max_speculative_tokens(self) -> int | None:
        return 1


class ToyArgs(AlgoArgs):
    """Toy head arguments."""

    toy_init_std: float = Field(0.02, gt=0, description="Toy: standard deviation of the head's initial weights.")


@register_algorithm
class Toy(DraftAlgorithm):
    name = "toy"
    title = "Toy head"
    summary = "A linear head over the fused target states of the last verified position; one token per step."
    config_class = ToyConfig
    args_class = ToyArgs
    needs_last_layer = False

    def speculative_tokens(self, args):
        return 1

    def build(self, target, args, *, aux_layer_ids, token_counts, seed, init_from=None):
        from .model import build

        return self.load(init_from, target) if init_from else build(target, list(aux_layer_ids), args, seed)

    def load(self, path, target=None, *, allow_pickle=False, dtype=None):
        from .model import load

        return load(path)

    def save(self, draft, path, *, dtype=None, config_updates=None):
        from engine.format.checkpoint import save_checkpoint

        return save_checkpoint(path, {**draft.config.to_dict(), **(config_updates or {})}, draft.state_dict(),
                               dtype=dtype)

    def collate(self, samples, layout, max_tokens, args):
        from .model import collate

        return collate(samples, layout, max_tokens)

    def objective(self, draft, verifier, args, device):
        from .model import ToyObjective

        return ToyObjective()

    def proposer(self, draft, **options):
        from .model import ToyProposer

        return ToyProposer(draft)

    def acceptance_counts(self, draft, aux, token_ids, k):
        from .model import acceptance_counts

        return acceptance_counts(draft, aux, token_ids, k)
