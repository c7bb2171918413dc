"""Post-hoc sequential temperature scaling of DSpark's confidence head (DSpark paper, section 3.3): one temperature
per slot, fitted left to right on held-out blocks so that the cumulative product prod_{i<=k} sigmoid(z_i / T_i)
matches the observed survival prod_{i<=k} alpha_i, where alpha_i = 1 - TV(p_draft, p_target) is slot i's
acceptance rate; the score is the expected calibration error (ECE) of that product."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

# log-spaced temperatures from 0.25 to 8 (1.0 included): a 1-D grid search per slot, as the paper does
TEMPERATURE_GRID = torch.logspace(-2, 3, 41, base=2.0)


def expected_calibration_error(pred: torch.Tensor, observed: torch.Tensor, bins: int = 10) -> float:
    """ECE of predictions [n] in [0, 1] against observed rates [n]: sum_b (n_b / n) |mean pred_b - mean obs_b| over
    equal-width bins of the prediction."""
    if pred.numel() == 0:
        return 0.0
    which = (pred.clamp(0, 1) * bins).long().clamp(max=bins - 1)
    total = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            total += float(sel.sum()) * abs(float(pred[sel].mean()) - float(observed[sel].mean()))
    return total / pred.numel()


def survival(conf_logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """conf_logits [N, B], temperatures [B] -> prod_{i<=k} sigmoid(z_i / T_i) [N, B]."""
    return torch.cumprod(torch.sigmoid(conf_logits / temperatures[None, :]), dim=1)


def cumulative_ece(conf_logits: torch.Tensor, accept: torch.Tensor, valid: torch.Tensor,
                   temperatures: torch.Tensor) -> list[float]:
    """Per-slot ECE of the predicted survival against the observed one (valid slots only) -> [B]."""
    pred, observed = survival(conf_logits, temperatures), torch.cumprod(accept, dim=1)
    return [expected_calibration_error(pred[valid[:, k], k], observed[valid[:, k], k])
            for k in range(conf_logits.shape[1])]


def fit_temperatures(conf_logits: torch.Tensor, accept: torch.Tensor, valid: torch.Tensor,
                     grid: torch.Tensor = TEMPERATURE_GRID) -> torch.Tensor:
    """Sequential temperature scaling: conf_logits, accept [N, B] (acceptance rates), valid [N, B] bool ->
    temperatures [B]. Slot k's temperature minimises the ECE of the survival at k with slots < k already fixed."""
    b = conf_logits.shape[1]
    temps = torch.ones(b)
    observed = torch.cumprod(accept, dim=1)
    prefix = torch.ones(conf_logits.shape[0])                       # prod_{i<k} sigmoid(z_i / T_i), fitted
    for k in range(b):
        rows = valid[:, k]
        if rows.any():
            scores = [expected_calibration_error(prefix[rows] * torch.sigmoid(conf_logits[rows, k] / t),
                                                 observed[rows, k]) for t in grid]
            temps[k] = grid[int(torch.tensor(scores).argmin())]
        prefix = prefix * torch.sigmoid(conf_logits[:, k] / temps[k])
    return temps


@torch.no_grad()
def collect(objective, draft, batches: Iterable[dict[str, torch.Tensor]], max_blocks: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw confidence logits, acceptance rates and valid masks [N, B] of held-out blocks (at most `max_blocks`)."""
    temps = draft.confidence_temperature.clone()
    draft.confidence_temperature.fill_(1.0)                         # raw logits: the fit starts from scratch
    confs, accepts, valids, n = [], [], [], 0
    try:
        for batch in batches:
            t = objective.terms(draft, batch)
            confs.append(t["conf"].float().cpu())
            accepts.append((1.0 - t["tv"]).float().cpu())
            valids.append(t["valid"].cpu())
            n += int(t["valid"].shape[0])
            if n >= max_blocks:
                break
    finally:
        draft.confidence_temperature.copy_(temps)
    if not confs:
        return torch.zeros(0, draft.block_size), torch.zeros(0, draft.block_size), torch.zeros(0, draft.block_size,
                                                                                                   dtype=torch.bool)
    return (torch.cat(confs)[:max_blocks], torch.cat(accepts)[:max_blocks], torch.cat(valids)[:max_blocks])


def calibrate(draft, objective, batches: Iterable[dict[str, torch.Tensor]], max_blocks: int) -> dict[str, Any] | None:
    """Fit the temperatures on held-out batches, store them in the draft (its config and buffer) and return the
    report (ECE of the cumulative survival per slot before and after, on blocks the fit did not see; the
    temperatures; blocks used)."""
    if draft.confidence_head is None or max_blocks <= 0:
        return None
    was_training = draft.training
    draft.eval()
    conf, accept, valid = collect(objective, draft, batches, max_blocks)
    draft.train(was_training)
    if conf.shape[0] == 0:
        return None
    # fit on the even blocks, report on the odd ones (the same blocks when there is only one)
    fit, held = (slice(0, None, 2), slice(1, None, 2)) if conf.shape[0] > 1 else (slice(None), slice(None))
    temps = fit_temperatures(conf[fit], accept[fit], valid[fit])
    before = cumulative_ece(conf[held], accept[held], valid[held], torch.ones_like(temps))
    after = cumulative_ece(conf[held], accept[held], valid[held], temps)
    draft.confidence_temperature.copy_(temps)
    draft.config.confidence_temperatures = [round(float(t), 4) for t in temps]
    return {"blocks": int(conf.shape[0]), "temperatures": draft.config.confidence_temperatures,
            "ece_before": [round(x, 4) for x in before], "ece_after": [round(x, 4) for x in after],
            "mean_ece_before": round(sum(before) / len(before), 4),
            "mean_ece_after": round(sum(after) / len(after), 4)}
