"""Moved to engine.algos.common.batching; a re-export for branches written before the move, removed after the merge."""
from engine.algos.common.batching import *  # noqa: F403
