"""DSpark training: DFlash's random-anchor blocks with every slot predicting; the loss is
ce * CE(data token) + tv * TV(p_draft, p_target) + conf * BCE(c_k, 1 - TV), position-weighted per slot, with every
slot after a block's first invalid label masked."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.algos.common.batching import Layout
from engine.algos.dflash.train import DFlashObjective, block_labels
from engine.algos.dflash.train import collate as dflash_collate
from engine.algos.dspark.model import DSparkDraft
from engine.errors import WorkbenchError


def collate(samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int, *, block_size: int,
            max_anchors: int) -> dict[str, torch.Tensor]:
    """DFlash's random-anchor blocks, always with the target's last layer (`verifier_last` [1, T, Ht])."""
    if layout.last_column < 0:
        raise WorkbenchError("DSpark training needs the target's last layer in the data (its TV and confidence "
                             "terms read the target's distribution)", hint="extract again with --algo dspark")
    return dflash_collate(samples, layout, max_tokens, block_size=block_size, max_anchors=max_anchors, with_last=True)


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-k/gamma) for slots k = 0..B-1 (every slot predicts; speculators' decay with sample_from_anchor)."""
    return torch.tensor([math.exp(-k / gamma) for k in range(block_size)], device=device)


def dspark_labels(batch: dict[str, torch.Tensor], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [N,B], valid [N,B]): slot k drafts the data token at anchor + k + 1; a slot counts only while every
    earlier slot of its block had a valid label (masked after the first invalid one)."""
    labels, valid = block_labels(batch, block_size, offset=1)
    return labels, torch.cumprod(valid.long(), dim=1).bool()


def total_variation(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """logits [.., Vd], target_probs [.., Vd] -> TV = 1/2 |q - p|_1 = 1 - sum min(p, q) [..] (fp32)."""
    q = F.softmax(logits.float(), -1)
    return 1.0 - torch.minimum(q, target_probs.float()).sum(-1)


class DSparkObjective(DFlashObjective):
    """The three-term DSpark loss and its metrics (greedy per-slot accuracy, acceptance, confidence calibration).

    Reuses DFlash's draft-vocabulary lookup and its target distribution (the target's last layer through its final
    norm and the head rows of the draft vocabulary)."""

    def __init__(self, draft: DSparkDraft, verifier, *, dflash_decay_gamma: float, ce_alpha: float, tv_alpha: float,
                 confidence_head_alpha: float, device: str):
        super().__init__(draft, verifier, loss_fn="kl", dflash_decay_gamma=dflash_decay_gamma, device=device)
        self.weights = slot_weights(self.block_size, dflash_decay_gamma, device)
        self.alphas = (ce_alpha, tv_alpha, confidence_head_alpha)

    def target_probs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[N, B, Vd]: the target's distribution of the token slot k drafts (its output at anchor + k)."""
        pos = batch["anchors"][:, None] + torch.arange(self.block_size, device=batch["anchors"].device)[None, :]
        pos = pos.clamp(max=batch["input_ids"].shape[1] - 1)
        with torch.no_grad():
            return F.softmax(self.finish(self.norm(batch["verifier_last"][0, pos].float())
                                         @ self.head_rows.float().T), -1)

    def terms(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-slot quantities [N, B]: ce, tv, the confidence logit (or None), labels, valid (in the draft vocab)."""
        logits, conf = model(batch["aux"], batch["input_ids"], batch["position_ids"], batch["document_ids"],
                             batch["anchors"])                                # [N,B,Vd], [N,B]
        labels, valid = dspark_labels(batch, self.block_size)
        in_vocab = valid
        if self.draft_ids_of_target is not None:
            labels = self.draft_ids_of_target[labels]
            in_vocab = valid & (labels >= 0)                                  # CE only where the label is drafted
        labels = labels.clamp(min=0)
        ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
        tv = total_variation(logits, self.target_probs(batch))
        return {"logits": logits, "conf": conf, "labels": labels, "valid": valid, "in_vocab": in_vocab, "ce": ce,
                "tv": tv}

    def __call__(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        t = self.terms(model, batch)
        valid = t["valid"]
        w = self.weights[None, :] * valid
        w_ce = self.weights[None, :] * t["in_vocab"]
        denom, denom_ce = w.sum().clamp(min=1e-6), w_ce.sum().clamp(min=1e-6)
        ce_alpha, tv_alpha, conf_alpha = self.alphas
        ce = (t["ce"] * w_ce).sum() / denom_ce
        tv = (t["tv"] * w).sum() / denom
        loss = ce_alpha * ce + tv_alpha * tv
        bce = None
        if t["conf"] is not None:
            accept = (1.0 - t["tv"]).detach()                                 # c*_k = 1 - TV, the acceptance rate
            bce = F.binary_cross_entropy_with_logits(t["conf"].float(), accept, reduction="none")
            loss = loss + conf_alpha * (bce * w).sum() / denom
        return loss, self._stats(t, bce)

    @torch.no_grad()
    def _stats(self, t: dict[str, torch.Tensor], bce: torch.Tensor | None) -> dict[str, float]:
        valid, labels = t["valid"], t["labels"]
        correct = (t["logits"].argmax(-1) == labels) & t["in_vocab"]
        run = torch.cumprod(correct.long(), dim=1)                            # leading correct slots per block
        accept = (1.0 - t["tv"]) * valid
        blocks = valid[:, 0]
        stats = {"blocks": float(blocks.sum()), "accepted_sum": float((run.sum(1) * blocks).sum()),
                 "tau_sum": float((torch.cumprod(accept, 1).sum(1) * blocks).sum()),
                 "ce_sum": float((t["ce"] * t["in_vocab"]).sum()), "ce_total": float(t["in_vocab"].sum()),
                 "tv_sum": float((t["tv"] * valid).sum()), "tv_total": float(valid.sum())}
        if bce is not None:
            pred = torch.sigmoid(t["conf"].float())
            stats["conf_bce_sum"] = float((bce * valid).sum())
            stats["conf_abs_error_sum"] = float(((pred - (1.0 - t["tv"])).abs() * valid).sum())
        for k in range(self.block_size):
            # full_acc: slots 0..k all correct (EAGLE-3's meaning); pos_acc: slot k alone
            stats[f"full_acc_{k}_sum"] = float((run[:, k] * valid[:, k]).sum())
            stats[f"pos_acc_{k}_sum"] = float(correct[:, k].sum())
            stats[f"slot_{k}_total"] = float(valid[:, k].sum())
        return stats

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        out = {}
        for k in range(self.block_size):
            total = stats.get(f"slot_{k}_total", 0.0)
            out[f"full_acc_{k}"] = stats.get(f"full_acc_{k}_sum", 0.0) / total if total else 0.0
            out[f"pos_acc_{k}"] = stats.get(f"pos_acc_{k}_sum", 0.0) / total if total else 0.0
        for name, total in (("ce", "ce_total"), ("tv", "tv_total"), ("conf_bce", "tv_total"),
                            ("conf_abs_error", "tv_total")):
            if f"{name}_sum" in stats and stats.get(total):
                out[name] = stats[f"{name}_sum"] / stats[total]
        blocks = stats.get("blocks", 0.0)
        # greedy: leading run of correct slots + 1 bonus (speculators' "eal"); sampled: 1 + sum_k prod_i (1 - TV_i)
        out["est_acceptance_length"] = 1.0 + stats.get("accepted_sum", 0.0) / blocks if blocks else 1.0
        out["tau_probabilistic"] = 1.0 + stats.get("tau_sum", 0.0) / blocks if blocks else 1.0
        return out
