"""DFlash2 training: DFlash's random-anchor blocks and unary loss, plus speculators' selector term: a K-way
cross-entropy over each slot's unary top-K (the hard target put in the last slot when missing), teacher-forced on
the data's previous token, slot-weighted as the unary loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.algos.common.batching import Layout
from engine.algos.dflash.train import DFlashObjective, block_labels, drafted
from engine.algos.dflash.train import collate as dflash_collate
from engine.algos.dflash2.model import DFlash2Draft
from engine.errors import WorkbenchError


def collate(samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int, *, block_size: int,
            max_anchors: int, with_last: bool) -> dict[str, torch.Tensor]:
    """DFlash's random-anchor blocks (with the target's last layer for the KL loss)."""
    if with_last and layout.last_column < 0:
        raise WorkbenchError("DFlash2's KL loss needs the target's last layer in the data",
                             hint="extract again with --algo dflash2, or train with --loss-fn ce")
    return dflash_collate(samples, layout, max_tokens, block_size=block_size, max_anchors=max_anchors,
                          with_last=with_last)


class DFlash2Objective(DFlashObjective):
    """unary (CE or KL, DFlash's) + selector_loss_alpha × the selector's K-way CE; greedy metrics follow the
    selector's teacher-forced choices (speculators' `eal`), counted wrong where the unary top-K missed the target."""

    def __init__(self, draft: DFlash2Draft, verifier, *, loss_fn: str, dflash_decay_gamma: float,
                 selector_loss_alpha: float, device: str):
        super().__init__(draft, verifier, loss_fn=loss_fn, dflash_decay_gamma=dflash_decay_gamma, device=device)
        self.selector_alpha = selector_loss_alpha

    def __call__(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        labels, valid = drafted(*block_labels(batch, self.block_size))     # [N, B-1]: full vocabulary
        probs = self.target_probs(batch) if self.loss_fn == "kl" else None  # [N, B-1, V], once for both terms
        hard = probs.argmax(-1) if probs is not None else labels  # speculators' selector target: the target's argmax
        logits, candidates, scores, where, contains = model(
            batch["aux"], batch["input_ids"], batch["position_ids"], batch["document_ids"], batch["anchors"], hard)
        unary = self.unary_loss(logits, labels, valid, batch, probs)
        w = self.weights[None, 1:] * valid
        ce = F.cross_entropy(scores.float().flatten(0, 1), where.flatten(), reduction="none").view_as(where)
        selector = (ce * w).sum() / w.sum().clamp(min=1e-6)
        loss = unary + self.selector_alpha * selector
        with torch.no_grad():
            chosen = candidates.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
            stats = self.slot_stats((chosen == labels) & contains & valid, valid)
            stats.update({"unary_loss_sum": float(unary), "selector_loss_sum": float(selector), "losses_total": 1.0,
                          "candidate_recall_sum": float((contains & valid).sum()),
                          "candidate_recall_total": float(valid.sum())})
        return loss, stats

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        out = super().summarize(stats)
        if stats.get("losses_total"):
            out["unary_loss"] = stats.get("unary_loss_sum", 0.0) / stats["losses_total"]
            out["selector_loss"] = stats.get("selector_loss_sum", 0.0) / stats["losses_total"]
        if stats.get("candidate_recall_total"):
            out["candidate_recall"] = stats["candidate_recall_sum"] / stats["candidate_recall_total"]
        return out
