"""The spread of a measured figure: a mean acceptance length over prompts (bootstrap) and a speedup over repeated
rounds (Student's t)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

BOOTSTRAP_DRAWS = 2000


def acceptance_spread(per_sample: Sequence[float | None], drafts: Sequence[int], *, draws: int = BOOTSTRAP_DRAWS,
                      seed: int = 0) -> dict[str, Any]:
    """Pooled mean acceptance length (1 + accepted / drafts over all prompts, vLLM's definition) with a 95%
    bootstrap interval over prompts, and the per-prompt standard deviation, min and max.

    per_sample[i]: prompt i's own mean acceptance length (None: it never drafted); drafts[i]: its drafting steps.
    One prompt has no interval (`ci95` None)."""
    pairs = [(t, d) for t, d in zip(per_sample, drafts, strict=True) if t is not None and d]
    if not pairs:
        return {"prompts": 0, "mean_acceptance_length": None, "ci95": None, "per_prompt_std": None,
                "per_prompt_min": None, "per_prompt_max": None}
    tau = np.array([t for t, _ in pairs])                        # [n] per-prompt acceptance length
    steps = np.array([d for _, d in pairs], dtype=np.float64)    # [n] drafting steps
    accepted = (tau - 1.0) * steps                               # [n] accepted draft tokens
    n = len(pairs)
    out = {"prompts": n, "mean_acceptance_length": float(1.0 + accepted.sum() / steps.sum()), "ci95": None,
           "per_prompt_std": float(tau.std(ddof=1)) if n > 1 else 0.0, "per_prompt_min": float(tau.min()),
           "per_prompt_max": float(tau.max())}
    if n > 1:
        pick = np.random.default_rng(seed).integers(0, n, size=(draws, n))  # [draws, n] prompts resampled
        boot = 1.0 + accepted[pick].sum(axis=1) / steps[pick].sum(axis=1)   # [draws]
        out["ci95"] = [float(x) for x in np.quantile(boot, [0.025, 0.975])]
    return out


# Student's t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95%); beyond 30 the normal's 1.96 is close
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_interval(values: Sequence[float]) -> dict[str, Any]:
    """Mean of repeated measurements (one per round) with its 95% t interval, and their min and max.
    One value has no interval (`ci95` None): a single run says nothing about its spread."""
    x = np.asarray(list(values), dtype=np.float64)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "ci95": None, "half_width": None, "min": None, "max": None}
    mean = float(x.mean())
    out = {"n": n, "mean": mean, "ci95": None, "half_width": None, "min": float(x.min()), "max": float(x.max())}
    if n > 1:
        half = (T975[n - 2] if n - 1 <= len(T975) else 1.96) * float(x.std(ddof=1)) / np.sqrt(n)
        out.update(ci95=[mean - half, mean + half], half_width=float(half))
    return out


__all__ = ["BOOTSTRAP_DRAWS", "T975", "acceptance_spread", "mean_interval"]
