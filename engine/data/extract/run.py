"""What both extraction backends share: the manifest header, the resumable `ExtractionRun`, progress, disk checks.

`ExtractionRun` holds the folder lock, resumes, checks free disk, writes verified samples atomically and keeps
the manifest and token frequencies in step with the files present, also after Ctrl-C.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.data.render.chat import RenderedRow
from engine.data.render.sources import BUILTIN_DATASETS
from engine.data.store.files import (
    FORMAT,
    MANIFEST,
    TOKEN_FREQ,
    FolderStats,
    incompatibilities,
    read_manifest,
    read_sample_stats,
    remove_stale_temp_files,
    sample_indices,
    sample_path,
    write_manifest,
    write_sample,
)
from engine.errors import WorkbenchError
from engine.fsutil import claim_names
from engine.jobs import DirLock, left_text, reporter
from engine.targets.dtypes import dtype_name, parse_dtype
from engine.targets.identity import chat_template_digest, target_digest

log = logging.getLogger(__name__)

_MANIFEST_EVERY_S = 30.0
_FILE_OVERHEAD = 512  # safetensors header and metadata per sample file, bytes (rounded up)


@dataclass(frozen=True)
class TargetInfo:
    """What the manifest records about the target (works without loading weights, for the vLLM backend)."""

    name: str  # Target.verifier_name: the hub id when known
    path: str
    num_layers: int
    hidden_size: int
    vocab_size: int

    @classmethod
    def from_target(cls, target) -> TargetInfo:
        return cls(target.verifier_name, target.ref.path, target.num_layers, target.hidden_size, target.vocab_size)

    @classmethod
    def from_config(cls, ref, config) -> TargetInfo:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(ref.hub_id or ref.path, ref.path, int(text.num_hidden_layers), int(text.hidden_size),
                   int(text.vocab_size))


SOURCE_FIELDS = ("dataset", "split", "max_length", "seed", "val_fraction", "algo")


def build_header(info: TargetInfo, layer_ids: Sequence[int], dtype: str | torch.dtype, *, backend: str,
                 source: dict[str, Any] | None = None, planned_samples: int | None = None) -> dict:
    """The manifest fields fixed for a run (counts are added by `write_manifest`); `source` names the data
    (SOURCE_FIELDS: dataset, split, max_length, seed, val_fraction, algo)."""
    unknown = set(source or {}) - set(SOURCE_FIELDS)
    if unknown:
        raise ValueError(f"unknown manifest source fields {sorted(unknown)}")
    src = {name: (source or {}).get(name) for name in SOURCE_FIELDS}
    ids = sorted(set(int(i) for i in layer_ids))
    return {
        "format": FORMAT, "target": info.name, "target_path": info.path,
        "layer_ids": ids, "aux_layer_ids": [i for i in ids if i != info.num_layers],
        "includes_last_layer": info.num_layers in ids,
        "num_layers": info.num_layers, "hidden_size": info.hidden_size, "vocab_size": info.vocab_size,
        "dtype": dtype_name(parse_dtype(dtype)), "token_ids_dtype": "int64", "loss_mask_dtype": "int64",
        "files": "hs_{i}.safetensors", "max_length": src["max_length"], "dataset": src["dataset"],
        "split": src["split"], "seed": src["seed"], "val_fraction": src["val_fraction"], "algo": src["algo"],
        "backend": backend,
        "planned_samples": planned_samples,
        # the digest of the target's tensors: training, evaluation and serving refuse other weights of the same shape
        "target_digest": target_digest(info.path),
        # the template the conversations were rendered with: `parity` compares it with the served tokenizer's
        "chat_template_sha256": chat_template_digest(info.path),
    }


def estimate_bytes(num_tokens: int, num_samples: int, num_layers: int, hidden_size: int, dtype) -> int:
    """Disk bytes for samples: hidden states + int64 token ids and loss mask + per-file header."""
    itemsize = torch.empty((), dtype=parse_dtype(dtype)).element_size()
    return num_tokens * (num_layers * hidden_size * itemsize + 16) + num_samples * _FILE_OVERHEAD


def check_disk(folder: Path, needed: int) -> None:
    """Refuse to start when the disk under `folder` cannot hold `needed` bytes (with 5% + 64 MiB to spare)."""
    free = shutil.disk_usage(folder).free
    required = needed * 1.05 + 64 * 2**20
    if required > free:
        raise WorkbenchError(
            f"extraction needs {human_bytes(required)} free (about {human_bytes(needed)} of samples, plus 5% and "
            f"64 MiB to spare) but only {human_bytes(free)} is free under {folder}",
            hint="use --max-samples or --max-length to extract less, fewer --layers, --dtype bf16, "
            "or an --out folder on a larger disk")
    log.info("estimated size %s (%s free)", human_bytes(needed), human_bytes(free))


def human_bytes(n: float) -> str:
    """A byte count for people: 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class ExtractionRun:
    """One extraction into `out`: lock, resume, verified writes, manifest on every exit (also Ctrl-C).

    with ExtractionRun(out, header, rows) as run:
        for i in run.pending: run.write(i, hidden_states_of_row_i)   # [T, L, H]
    """

    def __init__(self, out: str | Path, header: dict, rows: Sequence[RenderedRow], *, overwrite: bool = False,
                 check_space: bool = True):
        self.out = Path(out)
        self.header = dict(header, planned_samples=len(rows))
        self.rows = rows
        self.overwrite = overwrite
        self.check_space = check_space
        self.dtype = parse_dtype(header["dtype"])
        self.stats = FolderStats(int(header["vocab_size"]))
        self.pending: list[int] = []
        self.skipped_existing = 0
        self._lock = DirLock(self.out, "extract")
        self._last_manifest = 0.0
        self.manifest: dict = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> ExtractionRun:
        self._claim()  # before the lock file: a refused run leaves the folder as it was
        self._lock.__enter__()
        try:
            self._prepare_folder()
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.manifest = write_manifest(self.out, self.header, self.stats, complete=not self.remaining())
            if exc_type is not None:
                log.warning("extraction stopped (%s): %d of %d samples are on disk; re-run to resume",
                            exc_type.__name__, self.stats.samples, len(self.rows))
        finally:
            self._lock.__exit__(exc_type, exc, tb)

    def _claim(self) -> None:
        """Refuse a folder whose files this run would replace or delete unless the workbench wrote them."""
        names = [MANIFEST, TOKEN_FREQ, *(sample_path(self.out, i).name
                                         for i in sorted(set(range(len(self.rows))) | set(sample_indices(self.out))))]
        claim_names(self.out, names, kind="hidden-states", overwrite=self.overwrite, overwrite_flag="--overwrite")

    def _prepare_folder(self) -> None:
        if self.overwrite:
            for i in sample_indices(self.out):
                sample_path(self.out, i).unlink(missing_ok=True)
            for name in (MANIFEST, TOKEN_FREQ):
                (self.out / name).unlink(missing_ok=True)
        if n := remove_stale_temp_files(self.out):
            log.info("removed %d temp files of an interrupted write", n)
        old = read_manifest(self.out)
        if old is not None and (bad := incompatibilities(old, self.header)):
            raise WorkbenchError(f"{self.out} holds an extraction with other settings: {'; '.join(bad)}",
                                 hint="choose another --out folder, or add --overwrite to replace it")
        self._scan_existing()
        self.pending = [i for i in range(len(self.rows)) if i not in self.stats.tokens]
        if self.check_space:
            tokens = sum(self.rows[i].num_tokens for i in self.pending)
            needed = estimate_bytes(tokens, len(self.pending), len(self.header["layer_ids"]),
                                    int(self.header["hidden_size"]), self.dtype)
            check_disk(self.out, needed)
        self.manifest = write_manifest(self.out, self.header, self.stats, complete=not self.pending)

    def _scan_existing(self) -> None:
        """Count the samples already on disk (resume); re-do unreadable ones, refuse ones from other data."""
        shape_tail = (len(self.header["layer_ids"]), int(self.header["hidden_size"]))
        for i in sample_indices(self.out):
            path = sample_path(self.out, i)
            found = read_sample_stats(path)
            if found is None:
                log.warning("%s is unreadable: it will be extracted again", path.name)
                path.unlink(missing_ok=True)
                continue
            ids, mask, shape = found
            if tuple(shape[1:]) != shape_tail:
                raise WorkbenchError(f"{path} holds hidden states of shape {list(shape)}, not [T, {shape_tail[0]}, "
                                     f"{shape_tail[1]}] (other layers or another target)",
                                     hint="choose another --out folder, or add --overwrite to replace it")
            if i < len(self.rows) and (ids.tolist() != self.rows[i].input_ids or shape[0] != ids.numel()):
                raise WorkbenchError(f"{path} holds other tokens than row {i} of this dataset",
                                     hint="choose another --out folder, or add --overwrite to replace it")
            self.stats.add(i, ids, mask)
        self.skipped_existing = self.stats.samples
        if self.skipped_existing:
            log.info("resuming: %d samples already in %s", self.skipped_existing, self.out)

    # -- writing -----------------------------------------------------------------------------------

    def remaining(self) -> list[int]:
        return [i for i in range(len(self.rows)) if i not in self.stats.tokens]

    def write(self, index: int, hidden_states: torch.Tensor, token_ids: Sequence[int] | None = None) -> None:
        """Write sample `index` ([T, L, H]); `token_ids` (from a backend's own file) must equal the row's."""
        row = self.rows[index]
        if token_ids is not None and list(map(int, token_ids)) != row.input_ids:
            raise WorkbenchError(f"sample {index}: the backend returned other token ids than the dataset row",
                                 hint="the target's tokenizer or the data changed; re-run with --overwrite")
        hs = hidden_states.to(self.dtype)
        write_sample(self.out, index, hs, row.input_ids, row.loss_mask, row_id=row.id)
        self.stats.add(index, torch.tensor(row.input_ids), torch.tensor(row.loss_mask))
        if time.monotonic() - self._last_manifest > _MANIFEST_EVERY_S:
            self._last_manifest = time.monotonic()
            self.manifest = write_manifest(self.out, self.header, self.stats, complete=False)


class ExtractionProgress:
    """A tqdm bar over tokens (shows tokens/s and ETA) that also feeds the job reporter."""

    def __init__(self, run: ExtractionRun, total_tokens: int, enabled: bool = True):
        from tqdm import tqdm

        self.run = run
        self.total = max(total_tokens, 1)
        self.done = 0
        self.bar = tqdm(total=total_tokens, unit="tok", unit_scale=True, desc="extract", disable=not enabled,
                        dynamic_ncols=True)
        self.rep = reporter()
        self._last = 0.0
        self._start = time.monotonic()
        if self.rep.active:  # until it has its own rate, the UI counts down what this target's tokens took before
            phase = f"extracting the hidden states of {run.header.get('target')}"
            self.rep.phase(phase, self.total, message=f"{phase}: 0/{len(run.rows)} samples")

    def __enter__(self) -> ExtractionProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()

    def advance(self, tokens: int) -> None:
        self.done += tokens
        self.bar.update(tokens)
        now = time.monotonic()
        if self.rep.active and (now - self._last > 1.0 or self.done >= self.total):
            self._last = now
            rate = self.done / max(now - self._start, 1e-9)
            self.rep.update(f"extracted {self.run.stats.samples}/{len(self.run.rows)} samples ({rate:.0f} tok/s) "
                            + left_text(self.done, self.total, now - self._start),
                            self.done / self.total, samples=self.run.stats.samples, tokens_per_s=round(rate, 1))


def log_done(run: ExtractionRun) -> None:
    m = run.manifest
    log.info("%s: %d samples, %d tokens (%d loss tokens), layers %s, %s", run.out, m["samples"], m["tokens"],
             m["loss_tokens"], m["layer_ids"], m["dtype"])


def dataset_name(dataset: str) -> str:
    """How the manifest names a dataset: a built-in name, or the absolute path of a local one."""
    path = Path(dataset).expanduser()
    return str(path.resolve()) if path.exists() and str(dataset) not in BUILTIN_DATASETS else str(dataset)
