"""The on-disk hidden-states format (vLLM's `hs_{i}.safetensors` plus `loss_mask`), its manifest and its reader."""

# A folder holds, directly:
#     hs_{i}.safetensors      hidden_states [T, L, H] (ids ascending; bf16/fp16/fp32), token_ids [T] int64,
#                             loss_mask [T] int64; i = row index in the rendered dataset
#     manifest.json           what the files are (target, layer ids, sizes, dtype, counts, data provenance)
#     token_freq.safetensors  counts [vocab_size] int64: how often each token id is a loss token
# The first two keys are exactly what vLLM's ExampleHiddenStatesConnector writes, so readers of that format work.

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import WorkbenchError
from engine.fsutil import atomic_save_safetensors, atomic_write_json, read_json, tensors_digest_of

log = logging.getLogger(__name__)

FORMAT = "vllm-hidden-states"
MANIFEST = "manifest.json"
TOKEN_FREQ = "token_freq.safetensors"
SAMPLE_RE = re.compile(r"^hs_(\d+)\.safetensors$")
KEYS = ("hidden_states", "token_ids", "loss_mask")
SAMPLE_DIGEST = "sha256"  # metadata field of a sample file: `fsutil.tensors_digest` of its tensors
# Fields that must agree before a folder is resumed (anything else may change between runs).
COMPATIBLE_FIELDS = ("format", "target", "layer_ids", "hidden_size", "dtype", "max_length", "dataset", "split",
                     "seed", "val_fraction")


def sample_path(folder: str | Path, index: int) -> Path:
    return Path(folder) / f"hs_{index}.safetensors"


def sample_indices(folder: str | Path) -> list[int]:
    """Indices of the finished samples in a folder (temp files of an interrupted write are not samples)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := SAMPLE_RE.match(p.name)))


def remove_stale_temp_files(folder: str | Path) -> int:
    """Delete `.hs_*.tmp` leftovers of a killed writer; return how many."""
    n = 0
    for p in Path(folder).glob(".hs_*.tmp"):
        p.unlink(missing_ok=True)
        n += 1
    return n


def load_sample(path: str | Path) -> dict[str, torch.Tensor]:
    """{"hidden_states" [T, L, H], "token_ids" [T] int64, "loss_mask" [T] int64} from one sample file.

    Files written by vLLM itself have no loss_mask: every token then counts (mask of ones).
    """
    from safetensors.torch import load_file

    data = load_file(str(path), device="cpu")
    if "hidden_states" not in data or "token_ids" not in data:
        raise WorkbenchError(f"{path} is not a hidden-states sample (keys {sorted(data)})",
                             hint="point at a folder written by `python -m engine extract` or vLLM's connector")
    data["token_ids"] = data["token_ids"].long()
    data["loss_mask"] = data["loss_mask"].long() if "loss_mask" in data else torch.ones_like(data["token_ids"])
    return {k: data[k] for k in KEYS}


def write_sample(folder: str | Path, index: int, hidden_states: torch.Tensor, token_ids: Sequence[int] | torch.Tensor,
                 loss_mask: Sequence[int] | torch.Tensor, *, row_id: str | None = None) -> Path:
    """Verify one sample (shapes, finite values) and write it atomically; read its header back to check it."""
    token_ids = torch.as_tensor(token_ids, dtype=torch.int64)
    loss_mask = torch.as_tensor(loss_mask, dtype=torch.int64)
    hidden_states = hidden_states.detach().to("cpu").contiguous()
    t = token_ids.shape[0]
    if hidden_states.dim() != 3 or hidden_states.shape[0] != t or loss_mask.shape != (t,):
        raise WorkbenchError(f"sample {index}: hidden_states {tuple(hidden_states.shape)}, token_ids ({t},), "
                             f"loss_mask {tuple(loss_mask.shape)} do not fit [T, L, H] / [T] / [T]",
                             hint="this is a bug in the extractor; please report it")
    if not torch.isfinite(hidden_states).all():
        raise WorkbenchError(f"sample {index} (row {row_id}) has non-finite hidden states",
                             hint="use --dtype bf16 or fp32 (fp16 overflows on large activations)")
    path = sample_path(folder, index)
    tensors = {"hidden_states": hidden_states, "token_ids": token_ids, "loss_mask": loss_mask}
    metadata = {"index": str(index), **({"id": str(row_id)} if row_id is not None else {}),
                SAMPLE_DIGEST: tensors_digest_of(tensors)}  # `engine check --full` compares it with the file
    atomic_save_safetensors(tensors, path, metadata=metadata)
    check_sample_file(path, token_ids, tuple(hidden_states.shape))
    return path


def check_sample_file(path: Path, token_ids: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Read back a written file's token ids and header: it must hold what was meant to be written."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        ok = set(KEYS) <= set(f.keys()) and tuple(f.get_slice("hidden_states").get_shape()) == shape
        ok = ok and torch.equal(f.get_tensor("token_ids"), token_ids)
    if not ok:
        path.unlink(missing_ok=True)
        raise WorkbenchError(f"{path} did not read back as written (removed)", hint="check the disk, then re-run")


def read_sample_stats(path: Path) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]] | None:
    """(token_ids, loss_mask, hidden_states shape) read cheaply from a file; None if the file is unreadable."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            shape = tuple(f.get_slice("hidden_states").get_shape())
            ids = f.get_tensor("token_ids").long()
            mask = f.get_tensor("loss_mask").long() if "loss_mask" in f.keys() else torch.ones_like(ids)
        return ids, mask, shape
    except Exception:  # noqa: BLE001 - unreadable files are re-extracted
        return None


@dataclass
class FolderStats:
    """Counts over the samples present in a folder; kept up to date while writing."""

    vocab_size: int
    tokens: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (tokens, loss tokens)
    counts: torch.Tensor | None = None  # [vocab_size] int64

    def __post_init__(self):
        if self.counts is None:
            self.counts = torch.zeros(self.vocab_size, dtype=torch.int64)

    def add(self, index: int, token_ids: torch.Tensor, loss_mask: torch.Tensor) -> None:
        if index in self.tokens:
            return
        loss_ids = token_ids[loss_mask.bool()]
        self.counts += torch.bincount(loss_ids.clamp(0, self.vocab_size - 1), minlength=self.vocab_size)
        self.tokens[index] = (int(token_ids.numel()), int(loss_ids.numel()))

    @property
    def samples(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(t for t, _ in self.tokens.values())

    @property
    def loss_tokens(self) -> int:
        return sum(loss for _, loss in self.tokens.values())


def write_manifest(folder: Path, header: dict, stats: FolderStats, *, complete: bool) -> dict:
    """manifest.json and token_freq.safetensors describing exactly the samples present now."""
    manifest = {**header, "samples": stats.samples, "tokens": stats.num_tokens, "loss_tokens": stats.loss_tokens,
                "complete": complete, "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_save_safetensors({"counts": stats.counts}, folder / TOKEN_FREQ)
    atomic_write_json(folder / MANIFEST, manifest)
    return manifest


def read_manifest(folder: str | Path) -> dict | None:
    path = Path(folder) / MANIFEST
    try:
        return read_json(path)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise WorkbenchError(f"{path} is not valid JSON: {exc}",
                             hint="delete it; it is rebuilt on the next run") from exc


def incompatibilities(old: dict, new: dict) -> list[str]:
    """Fields in which an existing manifest disagrees with the run about to write into its folder."""
    return [f"{k}: {old.get(k)!r} (folder) vs {new.get(k)!r} (now)" for k in COMPATIBLE_FIELDS
            if k in old and old.get(k) != new.get(k)]


class HiddenStatesDataset(torch.utils.data.Dataset):
    """Random access to the samples of an extraction folder (or any folder of vLLM `hs_{i}` files).

    Items are dicts {"hidden_states" [T, L, H], "token_ids" [T] int64, "loss_mask" [T] int64}; item k is the
    k-th sample present in index order (`.indices[k]` is its row index).
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise WorkbenchError(f"{self.folder} is not a folder",
                                 hint="run `python -m engine extract --out DIR` first")
        self.indices = sample_indices(self.folder)
        self.manifest = read_manifest(self.folder) or {}
        if not self.indices:
            raise WorkbenchError(f"{self.folder} holds no hs_*.safetensors samples",
                                 hint="run `python -m engine extract --out DIR` first")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        """One sample, read from its file now (nothing is cached: a folder larger than memory streams)."""
        return load_sample(sample_path(self.folder, self.indices[k]))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for k in range(len(self)):
            yield self[k]

    def lengths(self) -> list[int]:
        """Tokens per item, read from the file headers (no tensor data is loaded)."""
        from safetensors import safe_open

        out = []
        for i in self.indices:
            with safe_open(str(sample_path(self.folder, i)), framework="pt") as f:
                out.append(int(f.get_slice("token_ids").get_shape()[0]))
        return out

    @property
    def layer_ids(self) -> list[int]:
        return list(self.manifest.get("layer_ids", []))

    def token_freq(self) -> torch.Tensor:
        """[vocab_size] int64 counts of loss tokens (recomputed from the samples if the file is missing)."""
        from safetensors.torch import load_file

        path = self.folder / TOKEN_FREQ
        if path.is_file():
            return load_file(str(path))["counts"]
        # one file at a time, token ids and masks only: the hidden states (nearly all of a file) are never read
        counts: torch.Tensor | None = None
        for i in self.indices:
            read = read_sample_stats(sample_path(self.folder, i))
            if read is None:
                raise WorkbenchError(f"{sample_path(self.folder, i)} is unreadable",
                                     hint="re-run the extraction into the same folder: it rewrites broken samples")
            ids, vocab = read[0][read[1].bool()], int(self.manifest.get("vocab_size") or 0)
            c = torch.bincount(ids.clamp(0, vocab - 1) if vocab else ids, minlength=vocab)
            if counts is not None and counts.numel() < c.numel():
                counts = torch.cat([counts, counts.new_zeros(c.numel() - counts.numel())])
            elif counts is not None and c.numel() < counts.numel():
                c = torch.cat([c, c.new_zeros(counts.numel() - c.numel())])
            counts = c if counts is None else counts + c
        return counts

    token_counts = token_freq
