"""A toy draft algorithm in one folder: a linear head over the fused target states that drafts one token."""

# It exists to prove the algorithm interface: registered from outside the tree (WORKBENCH_ALGO_PLUGINS), it brings
# its own speculators type `toy` (config.py: fields, default k, its vLLM stance, its own check), is trained by
# `python -m engine train --algo toy`, validated by `python -m engine validate`, listed in `--help` and on every
# page, saved, reloaded and used by `generate` without any other file of the workbench changing. Its torch side is
# found by the base class's conventions: io.py, train.py, proposer.py, evaluate.py.

from __future__ import annotations

from pydantic import Field

from engine.algos import AlgoArgs, DraftAlgorithm, register_algorithm

from .config import ToyConfig


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
