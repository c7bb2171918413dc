"""What the trainer checks and repairs before it resumes a run (issue 18): changed flags, metrics.jsonl, temp folders.

Kept apart from the training loop: `Trainer.run` and `Trainer.resume` call these functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_text, remove_ours

# Flags that may change between a run and its resume: how long to train and what to write, not what is trained.
HARMLESS_ON_RESUME = frozenset({
    "epochs", "max_steps", "out", "log_every", "val_every", "val_max_batches", "checkpoint_every",
    "keep_checkpoints", "device", "accept_target_change", "bad_samples", "max_nonfinite_steps",
})


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k == "algo_args":
            out.update(_flat(v, ""))  # algorithm arguments are flags like the others
        else:
            out[prefix + k] = v
    return out


def resume_changes(saved: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Refuse a resume whose flags change what is trained; return the harmless changes {flag: (before, now)}.

    `saved` is the config a checkpoint recorded (`trainer_state/state.json`), `current` this run's
    (`TrainConfig.model_dump(mode="json")`). Older checkpoints without a recorded config are not checked."""
    if not saved:
        return {}
    before, now = _flat(saved), _flat(current)
    changed = {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}
    harmful = {k: v for k, v in changed.items() if k not in HARMLESS_ON_RESUME}
    if harmful:
        listing = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in harmful.items())
        raise WorkbenchError(
            f"this output folder holds a run trained with other settings ({listing}); resuming would mix them",
            hint="give the earlier values again to resume, or a new --out folder to train afresh; "
                 f"these may change on resume: {', '.join(sorted(HARMLESS_ON_RESUME - {'out'}))}")
    return {k: v for k, v in changed.items() if k != "out"}


def record_resume(out: Path, step: int, changes: dict[str, tuple[Any, Any]]) -> None:
    """Append what changed at a resume to `resumes.jsonl` (one row per resume)."""
    row = {"step": step, "changed": {k: {"before": a, "now": b} for k, (a, b) in changes.items()}}
    with open(out / "resumes.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def repair_metrics(path: Path, last_step: int) -> int:
    """Keep only the complete rows of `metrics.jsonl` up to `last_step` (the checkpoint resumed from; -1: none).

    A hard kill can leave half a line, and rows logged after the last checkpoint are logged again when the
    steps are replayed. Rewritten atomically; returns how many lines were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ok = isinstance(row, dict) and int(row.get("step", 0)) <= last_step
        except (ValueError, TypeError):
            ok = False
        if ok:
            kept.append(line.decode("utf-8"))
        else:
            dropped += 1
    if dropped:
        atomic_write_text(path, "".join(k + "\n" for k in kept))
    return dropped


def clean_temp_checkpoints(out: Path) -> list[str]:
    """Remove what interrupted checkpoint writes leave: `atomic_directory`'s `.step_*.tmp` / `.step_*.old-*`
    folders under `out/checkpoints`, and `.draft.*.tmp` / `.draft.old-*` next to the final draft, when they carry
    the workbench's partial or ownership marker."""
    removed = []
    for folder, prefix in ((out / "checkpoints", ".step_"), (out, ".draft.")):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.is_dir() and p.name.startswith(prefix) and (p.name.endswith(".tmp") or ".old-" in p.name) \
                    and remove_ours(p):  # only our own temp folders (partial or owner marker), never a user's
                removed.append(p.name)
    return removed
