"""P-EAGLE training: EAGLE-3's shifted packed rows, COD-sampled (anchor, depth) elements, forward KL on each."""

from __future__ import annotations

import torch

from engine.algos.common.batching import Layout
from engine.algos.common.losses import forward_kl
from engine.algos.eagle3.train import collate as eagle3_collate
from engine.algos.eagle3.train import target_logits
from engine.algos.peagle.model import PEagleDraft


def cod_sample(loss_mask: torch.Tensor, document_ids: torch.Tensor, *, num_depths: int, ratio: float,
               ratio_min: float, max_anchors: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Conditional drop-token sampling (PARD, P-EAGLE) over one packed row: loss_mask/document_ids [T] ->
    (anchors [M], depths [M]) of the mask-slot elements, grouped by depth, anchors ascending."""
    # Depth 0 keeps every row (it is not returned). The n candidate anchors a are rows whose depth-1 element (row
    # a+1) is in the loss and in a's document, at most `max_anchors` of them drawn at random. Depth d keeps
    # n * max(ratio^d, ratio_min) anchors drawn among those whose depth d-1 element was kept and whose row a+d is in
    # the loss and the document, so every kept element has its whole rollout. Random draws use the torch RNG (the
    # trainer seeds and checkpoints it).
    t = loss_mask.numel()
    valid = loss_mask.bool()
    doc = document_ids

    def continues(a: torch.Tensor, d: int) -> torch.Tensor:
        """Anchors whose row a+d exists, is in the loss and in a's document."""
        row = a + d
        ok = row < t
        row = row.clamp(max=t - 1)
        return a[ok & valid[row] & (doc[row] == doc[a])]

    pool = continues(torch.arange(t, device=loss_mask.device), 1)
    if max_anchors is not None and pool.numel() > max_anchors:
        pool = pool[torch.randperm(pool.numel(), device=pool.device)[:max_anchors]].sort().values
    n = pool.numel()
    anchors, depths = [], []
    for d in range(1, num_depths):
        if d > 1:
            pool = continues(pool, d)
        size = min(pool.numel(), int(n * max(ratio ** d, ratio_min)))
        if size <= 0:
            break
        if size < pool.numel():
            pool = pool[torch.randperm(pool.numel(), device=pool.device)[:size]].sort().values
        anchors.append(pool)
        depths.append(torch.full_like(pool, d))
    if not anchors:
        empty = torch.zeros(0, dtype=torch.long, device=loss_mask.device)
        return empty, empty.clone()
    return torch.cat(anchors), torch.cat(depths)


def collate(samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int, *, num_depths: int,
            down_sample_ratio: float, down_sample_ratio_min: float, max_anchors: int | None) -> dict[str, torch.Tensor]:
    """EAGLE-3's shifted packed row (aux, verifier_last, input_ids, loss_mask, position_ids, document_ids) plus
    the COD-sampled mask-slot elements `anchors`/`depths` [M]."""
    batch = eagle3_collate(samples, layout, max_tokens)
    batch["anchors"], batch["depths"] = cod_sample(batch["loss_mask"][0], batch["document_ids"][0],
                                                   num_depths=num_depths, ratio=down_sample_ratio,
                                                   ratio_min=down_sample_ratio_min,
                                                   max_anchors=max_anchors)
    return batch


def element_rows(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(anchor [T+M], depth [T+M], target row o = anchor + depth [T+M]) of every element of `parallel_forward`."""
    t = batch["input_ids"].shape[1]
    rows = torch.arange(t, device=batch["anchors"].device)
    anchor = torch.cat([rows, batch["anchors"]])
    depth = torch.cat([torch.zeros_like(rows), batch["depths"]])
    return anchor, depth, anchor + depth


class PEagleObjective:
    """Forward KL to the target (its distribution over the draft vocabulary) on every sampled (anchor, depth)
    element in the loss, all weighted alike, as speculators 0.9.0 trains it (no depth decay, no filter on the
    target's top-1: checking that over the full vocabulary cost a [T, V] head product per step)."""

    def __init__(self, draft: PEagleDraft, verifier, *, num_depths: int, device: str):
        self.num_depths = num_depths
        self.norm, self.finish = verifier.final_norm_fn(), verifier.logit_transform()
        head = verifier.head_weight
        self.head_rows = (head[draft.t2d.cpu()] if draft.t2d is not None else head).to(device)  # [Vd, H]

    def __call__(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        anchor, depth, row = element_rows(batch)                                  # [T+M] each
        keep = batch["loss_mask"][0].bool()[row]                                  # [T+M] target row in the loss
        kept = keep.nonzero().squeeze(1)                                          # [K]
        # the heads (draft and target) run on the K elements in the loss only (70% of the shipped data's tokens)
        logits = model(batch["aux"], batch["input_ids"], batch["position_ids"], batch["document_ids"],
                       batch["anchors"], batch["depths"], kept)[0]                # [K, Vd]
        targets = target_logits(batch["verifier_last"][0, row[kept]], self.norm, self.head_rows,
                                self.finish)                                             # [K, Vd]
        kl = forward_kl(logits, torch.softmax(targets, -1))                       # [K]
        loss = kl.sum() / keep.sum().clamp(min=1)
        with torch.no_grad():
            correct = torch.zeros_like(keep)                                      # [T+M]; counted where kept
            correct[kept] = logits.argmax(-1) == targets.argmax(-1)
            stats = depth_stats(correct, keep, anchor, depth, kl, self.num_depths, batch["input_ids"].shape[1])
        return loss, stats

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        return summarize(stats, self.num_depths)


def depth_stats(correct: torch.Tensor, keep: torch.Tensor, anchor: torch.Tensor, depth: torch.Tensor,
                kl: torch.Tensor, num_depths: int, t: int) -> dict[str, float]:
    """Per depth d: loss, pos_acc (depth d right) and full_acc (depths 0..d of the same anchor all right, over
    anchors whose elements 0..d are all in the loss) as `*_sum`/`*_total` pairs. Elements come grouped by depth."""
    stats: dict[str, float] = {}
    kl_full = torch.zeros(keep.shape, device=kl.device)
    kl_full[keep] = kl.detach()
    alive = torch.zeros(t, dtype=torch.bool, device=correct.device)   # per anchor: depths so far all right
    counted = torch.zeros(t, dtype=torch.bool, device=correct.device)  # per anchor: depths so far all in the loss
    for d in range(num_depths):
        sel = depth == d
        a = anchor[sel]
        if d == 0:
            alive[a], counted[a] = correct[sel] & keep[sel], keep[sel]
        else:
            now_alive, now_counted = alive[a] & correct[sel] & keep[sel], counted[a] & keep[sel]
            alive.zero_()
            counted.zero_()
            alive[a], counted[a] = now_alive, now_counted
        kept = keep[sel]
        stats[f"loss_{d}_sum"] = float(kl_full[sel].sum())
        stats[f"pos_acc_{d}_sum"] = float((correct[sel] & kept).sum())
        stats[f"depth_{d}_total"] = float(kept.sum())
        stats[f"full_acc_{d}_sum"] = float(alive[a].sum())
        stats[f"full_acc_{d}_total"] = float(counted[a].sum())
    return stats


def summarize(stats: dict[str, float], num_depths: int) -> dict[str, float]:
    """Ratios per depth and the acceptance-length estimate 1 + sum_d full_acc_d (teacher-forced, sampled anchors)."""
    out = {}
    for d in range(num_depths):
        total = stats.get(f"depth_{d}_total", 0.0)
        out[f"loss_{d}"] = stats.get(f"loss_{d}_sum", 0.0) / total if total else 0.0
        out[f"pos_acc_{d}"] = stats.get(f"pos_acc_{d}_sum", 0.0) / total if total else 0.0
        full = stats.get(f"full_acc_{d}_total", 0.0)
        out[f"full_acc_{d}"] = stats.get(f"full_acc_{d}_sum", 0.0) / full if full else 0.0
    out["est_acceptance_length"] = 1.0 + sum(out[f"full_acc_{d}"] for d in range(num_depths))
    return out
