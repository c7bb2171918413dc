"""EAGLE-3 training objective: forward KL to the target per TTT step, with speculators' step alignment and metrics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.algos.common.batching import Layout
from engine.algos.common.losses import forward_kl
from engine.algos.eagle3.model import Eagle3Draft


def target_logits(verifier_last: torch.Tensor, norm, head_rows: torch.Tensor, finish=None) -> torch.Tensor:
    """Target distribution over the draft vocab: verifier lm_head rows (t2d) over norm(pre-norm last layer), then
    the family's own logit transform (`finish`: VerifierParts.logit_transform, e.g. Gemma 2's soft-capping).

    verifier_last [B,T,Ht] -> logits [B,T,Vd] (fp32, no grad)."""
    with torch.no_grad():
        logits = norm(verifier_last.float()) @ head_rows.float().T
        return finish(logits) if finish is not None else logits


def eagle3_loss(
    logits_per_step: list[torch.Tensor],
    targets: torch.Tensor,
    loss_mask: torch.Tensor,
    document_ids: torch.Tensor,
    decay: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sum over steps k of decay**k * masked-mean KL, and metric sums (`*_sum` / `*_total` pairs).

    Step k's logits at t predict the token at t+k+1, i.e. they face targets[t+k] (speculators'
    `align_for_step`). Pairs that cross a document boundary in a packed row are masked out.
    full_acc_k: steps 0..k all correct; cond_acc_k: step k correct given 0..k-1 correct.
    """
    t = targets.shape[1]
    target_probs = F.softmax(targets.float(), dim=-1)  # once per batch; sliced per step
    target_ids = targets.argmax(-1)
    prev = loss_mask.bool().clone()  # [B,T] positions still correct (indexed by draft start)
    loss = targets.new_zeros((), dtype=torch.float32)
    stats: dict[str, float] = {}
    for k, logits in enumerate(logits_per_step):
        s_logits = logits[:, : t - k]
        s_mask = loss_mask[:, k:].bool() & (document_ids[:, k:] == document_ids[:, : t - k])
        kl = forward_kl(s_logits, target_probs[:, k:])
        step_loss = (kl * s_mask).sum() / (s_mask.sum() + 1e-5)
        loss = loss + (decay ** k) * step_loss
        with torch.no_grad():
            correct = s_logits.argmax(-1) == target_ids[:, k:]
            s_prev = prev[:, : t - k]
            cond_total = float((s_prev & s_mask).sum())
            now = s_prev & correct
            prev = torch.cat([now, prev[:, t - k:]], dim=1)
            hit = float((now & s_mask).sum())
            stats[f"loss_{k}_sum"] = float(step_loss) * float(s_mask.sum())
            stats[f"loss_{k}_total"] = float(s_mask.sum())
            stats[f"full_acc_{k}_sum"] = hit
            stats[f"full_acc_{k}_total"] = float(s_mask.sum())
            stats[f"cond_acc_{k}_sum"] = hit
            stats[f"cond_acc_{k}_total"] = cond_total
    return loss, stats


def summarize(stats: dict[str, float], steps: int) -> dict[str, float]:
    """Ratios from `*_sum`/`*_total`, plus the acceptance-length estimate 1 + sum_k full_acc_k."""
    out = {}
    for k in range(steps):
        for name in ("loss", "full_acc", "cond_acc"):
            total = stats.get(f"{name}_{k}_total", 0.0)
            out[f"{name}_{k}"] = stats.get(f"{name}_{k}_sum", 0.0) / total if total else 0.0
    out["est_acceptance_length"] = 1.0 + sum(out[f"full_acc_{k}"] for k in range(steps))
    return out


class Eagle3Objective:
    """Forward KL to the target per TTT step, bound to a draft (its t2d picks the target rows) and its verifier."""

    def __init__(self, draft: Eagle3Draft, verifier, *, ttt_steps: int, ttt_step_loss_decay: float, device: str):
        self.steps, self.decay = ttt_steps, ttt_step_loss_decay
        self.norm, self.finish = verifier.final_norm_fn(), verifier.logit_transform()
        head = verifier.head_weight
        if draft.t2d is not None:
            head = head[draft.t2d.cpu()]
        self.head_rows = head.to(device)  # [Vd, H]

    def __call__(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        return draft_step(model, batch, self.norm, self.head_rows, self.steps, self.decay, self.finish)

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        return summarize(stats, self.steps)


def draft_step(draft: Eagle3Draft | torch.nn.Module, batch: dict[str, torch.Tensor], norm, head_rows: torch.Tensor,
               steps: int, decay: float, finish=None) -> tuple[torch.Tensor, dict[str, float]]:
    """One forward + loss on a packed batch (see `collate` for the keys).

    `draft` may be wrapped (DDP): it is called, so its forward (= ttt_forward) runs with gradient sync."""
    logits = draft(batch["aux"], batch["input_ids"], batch["position_ids"], batch["document_ids"], steps)
    targets = target_logits(batch["verifier_last"], norm, head_rows, finish)
    return eagle3_loss(logits, targets, batch["loss_mask"], batch["document_ids"], decay)


def collate(samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int,
            dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """EAGLE-3's shift (x_{t+1}, g_t, y_{t+1}, l_{t+1}) per sample, concatenated into one row [1, T].

    Keys: aux [1,T,A*H], verifier_last [1,T,H], input_ids, loss_mask, position_ids (1-based within a
    document), document_ids."""
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("aux", "last", "ids", "mask", "pos", "doc")}
    room = max_tokens
    for doc, s in enumerate(samples):
        t = min(int(s["token_ids"].shape[0]), room + 1)
        if t < 2:
            continue
        hs = s["hidden_states"][:t]                                        # [t, L, H]
        parts["aux"].append(hs[:-1, layout.aux_columns].flatten(1))        # g_0..g_{t-2}
        parts["last"].append(hs[1:, layout.last_column])                   # y_1..y_{t-1}
        parts["ids"].append(s["token_ids"][1:t].long())                    # x_1..x_{t-1}
        parts["mask"].append(s["loss_mask"][1:t].bool())                   # l_1..l_{t-1}
        parts["pos"].append(torch.arange(1, t))
        parts["doc"].append(torch.full((t - 1,), doc))
        room -= t - 1
        if room <= 0:
            break
    return {
        "aux": torch.cat(parts["aux"]).unsqueeze(0).to(dtype),
        "verifier_last": torch.cat(parts["last"]).unsqueeze(0).to(dtype),
        "input_ids": torch.cat(parts["ids"]).unsqueeze(0),
        "loss_mask": torch.cat(parts["mask"]).unsqueeze(0),
        "position_ids": torch.cat(parts["pos"]).unsqueeze(0),
        "document_ids": torch.cat(parts["doc"]).unsqueeze(0),
    }
