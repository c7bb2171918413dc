"""The spread of a mean acceptance length over prompts: per-prompt deviation and a bootstrap interval of the mean."""

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


__all__ = ["BOOTSTRAP_DRAWS", "acceptance_spread"]
