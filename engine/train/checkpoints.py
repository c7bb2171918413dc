"""The checkpoint folder of a training run: `step_N` folders, the `latest` pointer, pruning to the newest few."""

from __future__ import annotations

from pathlib import Path

from engine.fsutil import atomic_write_text, remove_ours

_CHECKPOINT_FILES = ("config.json", "model.safetensors", "README.md")


def is_legacy_checkpoint(folder: Path) -> bool:
    """A step checkpoint written before ownership markers: only the files the trainer writes, and its state."""
    if not (folder / "trainer_state" / "state.json").is_file():
        return False
    return all(p.is_dir() or p.name in _CHECKPOINT_FILES or p.relative_to(folder).parts[0] in ("trainer_state", "dcp")
               for p in folder.rglob("*"))


def prune_checkpoints(folder: Path, keep: int) -> list[Path]:
    """Delete the oldest `step_*` checkpoints beyond `keep`, only those the trainer wrote; return them."""
    steps = sorted(p for p in folder.glob("step_*") if p.is_dir())
    return [p for p in steps[:-keep] if remove_ours(p, also_ours=is_legacy_checkpoint)]


class CheckpointFolder:
    """`<out>/checkpoints/`: where the checkpoint of a step goes, which one is the latest, how many are kept."""

    def __init__(self, root: Path, keep: int):
        self.root, self.keep = Path(root), keep

    @staticmethod
    def name(step: int) -> str:
        return f"step_{step:07d}"

    def path(self, step: int) -> Path:
        return self.root / self.name(step)

    def latest(self) -> Path | None:
        """The checkpoint the `latest` pointer names, if it is complete (its trainer state is there)."""
        pointer = self.root / "latest"
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text().strip()
        return path if (path / "trainer_state" / "state.json").is_file() else None

    def commit(self, step: int) -> list[Path]:
        """Point `latest` at the checkpoint of `step`, then prune beyond `keep`; returns the pruned folders."""
        atomic_write_text(self.root / "latest", self.name(step) + "\n")
        return prune_checkpoints(self.root, self.keep)
