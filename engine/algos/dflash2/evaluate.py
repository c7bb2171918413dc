"""DFlash2's accepted-draft counts: DFlash's batched anchored blocks, each drafted by the selector's greedy walk
(`DFlash2Draft.greedy_drafts`), exactly as the proposer drafts."""

from engine.algos.dflash.evaluate import acceptance_counts

__all__ = ["acceptance_counts"]
