"""DFlash training: random anchors per packed row, one block per anchor, weighted CE (or forward KL) per slot."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.algos.common.batching import Layout
from engine.algos.common.losses import forward_kl
from engine.algos.dflash.model import DFlashDraft


def collate(samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int, *, block_size: int,
            max_anchors: int, with_last: bool) -> dict[str, torch.Tensor]:
    """Samples packed into one row [1, T] without a shift (DFlash reads g_t and x_t at the same t), plus anchors.

    An anchor is a position whose next token is supervised; at most `max_anchors` are drawn at random (the
    torch RNG, seeded and checkpointed by the trainer). Keys: aux [1,T,A*Ht], input_ids, loss_mask,
    position_ids (0-based per document), document_ids, anchors [N], and verifier_last [1,T,Ht] for the KL loss."""
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("aux", "last", "ids", "mask", "pos", "doc")}
    room = max_tokens
    for doc, s in enumerate(samples):
        t = min(int(s["token_ids"].shape[0]), room)
        if t < 2:
            continue
        hs = s["hidden_states"][:t]                          # [t, L, H]
        parts["aux"].append(hs[:, layout.aux_columns].flatten(1))
        if with_last:
            parts["last"].append(hs[:, layout.last_column])
        parts["ids"].append(s["token_ids"][:t].long())
        parts["mask"].append(s["loss_mask"][:t].bool())
        parts["pos"].append(torch.arange(t))
        parts["doc"].append(torch.full((t,), doc))
        room -= t
        if room <= 0:
            break
    ids, mask, doc = torch.cat(parts["ids"]), torch.cat(parts["mask"]), torch.cat(parts["doc"])
    # candidates: the next token is in the loss and in the same document
    nxt = torch.zeros_like(mask)
    nxt[:-1] = mask[1:] & (doc[1:] == doc[:-1])
    candidates = nxt.nonzero().flatten()
    if candidates.numel() > max_anchors:
        candidates = candidates[torch.randperm(candidates.numel())[:max_anchors]].sort().values
    batch = {"aux": torch.cat(parts["aux"]).unsqueeze(0).float(), "input_ids": ids.unsqueeze(0),
             "loss_mask": mask.unsqueeze(0), "position_ids": torch.cat(parts["pos"]).unsqueeze(0),
             "document_ids": doc.unsqueeze(0), "anchors": candidates}
    if with_last:
        batch["verifier_last"] = torch.cat(parts["last"]).unsqueeze(0).float()
    return batch


def block_labels(batch: dict[str, torch.Tensor], block_size: int, *,
                 offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [N,B] target ids, valid [N,B]): slot i of block j drafts the token at anchor_j + i + offset, valid
    when that position is in the loss and in the anchor's document. offset 0 (DFlash): slot 0 is the anchor and
    never counts; offset 1: every slot predicts (the anchor's slot drafts the next token)."""
    ids, mask, doc = batch["input_ids"][0], batch["loss_mask"][0].bool(), batch["document_ids"][0]
    anchors = batch["anchors"]
    t = ids.numel()
    pos = anchors[:, None] + offset + torch.arange(block_size, device=ids.device)[None, :]   # [N, B]
    inside = pos < t
    pos_c = pos.clamp(max=t - 1)
    valid = inside & mask[pos_c] & (doc[pos_c] == doc[anchors][:, None])
    if offset == 0:
        valid[:, 0] = False
    return ids[pos_c], valid


def drafted(labels: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_labels` (offset 0) [N, B] -> the drafted slots 1..B-1 [N, B-1] (slot 0, the anchor, never counts)."""
    return labels[:, 1:], valid[:, 1:]


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_0 = 0 (the anchor), w_i = exp(-(i-1)/gamma): speculators' fixed exponential decay."""
    w = torch.tensor([0.0] + [math.exp(-(i - 1) / gamma) for i in range(1, block_size)], device=device)
    return w


class DFlashObjective:
    """Weighted CE on the data tokens (or forward KL to the target) per block slot, and per-slot accuracies."""

    def __init__(self, draft: DFlashDraft, verifier, *, loss_fn: str, dflash_decay_gamma: float, device: str):
        self.block_size = draft.block_size
        self.loss_fn, self.gamma = loss_fn, dflash_decay_gamma
        self.weights = slot_weights(self.block_size, dflash_decay_gamma, device)
        self.t2d = draft.t2d
        self.draft_ids_of_target = None
        if draft.t2d is not None:  # target id -> draft id (-1 outside the draft vocabulary)
            lookup = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
            selected = draft.t2d.nonzero().flatten().cpu()
            lookup[selected] = torch.arange(selected.numel())
            self.draft_ids_of_target = lookup.to(device)
        if loss_fn == "kl":
            self.norm, self.finish = verifier.final_norm_fn(), verifier.logit_transform()
            head = verifier.head_weight
            self.head_rows = (head[draft.t2d.cpu()] if draft.t2d is not None else head).to(device)

    def __call__(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        labels, valid = self.labels(batch)                                   # [N, B-1]: the drafted slots
        logits = model(batch["aux"], batch["input_ids"], batch["position_ids"], batch["document_ids"],
                       batch["anchors"])                                     # [N, B-1, Vd]
        loss = self.unary_loss(logits, labels, valid, batch)
        with torch.no_grad():
            stats = self.slot_stats((logits.argmax(-1) == labels) & valid, valid)
        return loss, stats

    def labels(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels [N, B-1] in the draft vocabulary, valid [N, B-1]) of the drafted slots 1..B-1: a label outside
        the draft vocabulary is dropped."""
        labels, valid = drafted(*block_labels(batch, self.block_size))
        if self.draft_ids_of_target is not None:
            labels = self.draft_ids_of_target[labels]
            valid = valid & (labels >= 0)
        return labels.clamp(min=0), valid

    def target_probs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[N, B-1, Vd]: the target's distribution of the token drafted slot i = 1..B-1 drafts (its output at
        anchor + i - 1)."""
        pos = batch["anchors"][:, None] + torch.arange(self.block_size - 1, device=batch["anchors"].device)[None, :]
        pos = pos.clamp(max=batch["input_ids"].shape[1] - 1)
        with torch.no_grad():
            return F.softmax(self.finish(self.norm(batch["verifier_last"][0, pos].float())
                                         @ self.head_rows.float().T), -1)

    def unary_loss(self, logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor,
                   batch: dict[str, torch.Tensor], probs: torch.Tensor | None = None) -> torch.Tensor:
        """The slot-weighted CE on the labels (or forward KL to the target) of the drafted slots' logits
        [N, B-1, Vd]; `probs`: the target's distribution when the caller already computed it (`target_probs`)."""
        w = self.weights[None, 1:] * valid
        if self.loss_fn == "kl":
            probs = self.target_probs(batch) if probs is None else probs
            per_slot = forward_kl(logits, probs)
        else:
            per_slot = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none"
                                       ).view_as(labels)
        return (per_slot * w).sum() / w.sum().clamp(min=1e-6)

    def slot_stats(self, correct: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
        """Sums of the per-slot accuracies and of the leading run of correct slots, from correct/valid [N, B-1]
        of the drafted slots (column j is slot j + 1)."""
        run = torch.cumprod(correct.long(), dim=1)                           # leading correct slots per block
        blocks = valid[:, 0]
        stats = {"blocks": float(blocks.sum()), "accepted_sum": float((run.sum(1) * blocks).sum())}
        for i in range(1, self.block_size):
            # full_acc: slots 1..i all correct (EAGLE-3's meaning); pos_acc: slot i alone
            stats[f"full_acc_{i}_sum"] = float((run[:, i - 1] * valid[:, i - 1]).sum())
            stats[f"pos_acc_{i}_sum"] = float(correct[:, i - 1].sum())
            stats[f"slot_{i}_total"] = float(valid[:, i - 1].sum())
        return stats

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        out = {}
        for i in range(1, self.block_size):
            total = stats.get(f"slot_{i}_total", 0.0)
            out[f"full_acc_{i - 1}"] = stats.get(f"full_acc_{i}_sum", 0.0) / total if total else 0.0
            out[f"pos_acc_{i - 1}"] = stats.get(f"pos_acc_{i}_sum", 0.0) / total if total else 0.0
        blocks = stats.get("blocks", 0.0)
        # speculators' "eal": leading run of correct slots + 1 bonus, over blocks (teacher-forced, all anchors)
        out["est_acceptance_length"] = 1.0 + stats.get("accepted_sum", 0.0) / blocks if blocks else 1.0
        return out
