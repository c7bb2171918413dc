"""EAGLE-3 drafts: model, vocabulary mapping, checkpoint I/O, proposer and trainer."""

from engine.algos.eagle3.io import build_eagle3, load_eagle3, save_eagle3
from engine.algos.eagle3.model import DraftCache, Eagle3Draft

__all__ = ["DraftCache", "Eagle3Draft", "build_eagle3", "load_eagle3", "save_eagle3"]
