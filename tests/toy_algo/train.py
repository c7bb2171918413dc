"""The toy head's batches (g_t -> x_{t+2}) and its cross-entropy objective."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def collate(samples, layout, max_tokens):
    aux, labels, mask = [], [], []
    for s in samples:
        t = int(s["token_ids"].shape[0])
        if t < 3:
            continue
        aux.append(s["hidden_states"][: t - 2, layout.aux_columns].flatten(1).float())  # g_0..g_{t-3}
        labels.append(s["token_ids"][2:t].long())                                        # x_2..x_{t-1}
        mask.append(s["loss_mask"][2:t].bool())
    return {"aux": torch.cat(aux)[None], "labels": torch.cat(labels)[None], "loss_mask": torch.cat(mask)[None]}


class ToyObjective:
    def __init__(self, draft, verifier, *, device: str):
        pass

    def __call__(self, model, batch):
        logits = model(batch["aux"])
        mask = batch["loss_mask"]
        ce = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="none").view_as(mask)
        loss = (ce * mask).sum() / mask.sum().clamp(min=1)
        hits = ((logits.argmax(-1) == batch["labels"]) & mask).sum()
        return loss, {"acc_sum": float(hits), "acc_total": float(mask.sum())}

    def summarize(self, stats):
        acc = stats.get("acc_sum", 0.0) / max(stats.get("acc_total", 0.0), 1.0)
        return {"full_acc_0": acc, "est_acceptance_length": 1.0 + acc}
