"""Hidden states computed on the fly while training (no disk): the same sample dicts as `HiddenStatesDataset`."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Iterator, Sequence

import torch

from engine.data.extract.dataset import DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, capture_batch, plan_padded_batches
from engine.data.extract.layer_ids import resolve_layer_ids
from engine.data.render.chat import RenderedRow, render_rows
from engine.data.render.datasets import DatasetSummary
from engine.errors import WorkbenchError
from engine.targets.dtypes import parse_dtype

log = logging.getLogger(__name__)


def as_rendered(rows: Sequence, tokenizer, max_length: int | None, skipped: Counter) -> list[RenderedRow]:
    """Accept RenderedRows, tokenised dicts or chat rows; render (and truncate) them all the same way."""
    dicts = [r.to_json() if isinstance(r, RenderedRow) else dict(r, id=str(r.get("id", k))) for k, r in enumerate(rows)]
    summary = DatasetSummary(source="rows", split="all", skipped=skipped)
    return render_rows(tokenizer, dicts, max_length, summary=summary)


class OnlineHiddenStates(torch.utils.data.Dataset):
    """{"hidden_states" [T, L, H], "token_ids" [T] int64, "loss_mask" [T] int64} computed by `target` on demand."""
    # The same items as `HiddenStatesDataset` (hidden states stay on the target's device). Rows are rendered
    # once up front (bad rows are counted in `.skipped`). Access by index (`ds[i]`, one forward), by a list of
    # indices (`get_many`, one batched forward: use it for whole training batches), or iterate: each pass visits
    # every row once, in order or shuffled per epoch (`set_epoch`) from `shuffle_seed`, computing windows of
    # `batch_size * 4` rows at a time in token-budgeted batches of similar length.

    def __init__(self, target, rows: Sequence, layer_ids: Sequence[int] | None = None, *,
                 max_length: int | None = None, dtype: str | torch.dtype = "bf16",
                 batch_size: int = DEFAULT_BATCH_SIZE, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                 shuffle_seed: int | None = None):
        self.target = target
        self.skipped: Counter = Counter()
        self.rows = as_rendered(rows, target.tokenizer, max_length, self.skipped)
        if not self.rows:
            raise WorkbenchError("no usable rows for online extraction", hint=f"skipped: {dict(self.skipped)}")
        self.layer_ids = resolve_layer_ids(target.num_layers, layer_ids)  # an algorithm's: resolve_layer_ids first
        self.dtype = parse_dtype(dtype)
        self.batch_size = batch_size
        self.batch_tokens = batch_tokens
        self.shuffle_seed = shuffle_seed  # None: rows in order; else shuffled per epoch from this seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return [r.num_tokens for r in self.rows]

    def token_freq(self) -> torch.Tensor:
        """[vocab_size] int64 counts of loss tokens over all rows (what `token_freq.safetensors` holds offline)."""
        counts = torch.zeros(self.target.vocab_size, dtype=torch.int64)
        for r in self.rows:
            ids = torch.tensor(r.input_ids)[torch.tensor(r.loss_mask, dtype=torch.bool)]
            counts += torch.bincount(ids.clamp(0, self.target.vocab_size - 1), minlength=self.target.vocab_size)
        return counts

    token_counts = token_freq

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.get_many([i])[0]

    def get_many(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """Samples for `indices` (in that order) from token-budgeted batched forwards."""
        indices = list(indices)
        out: list[dict | None] = [None] * len(indices)
        sizes = [self.rows[i].num_tokens for i in indices]
        for batch in plan_padded_batches(sizes, self.batch_size, self.batch_tokens):
            for p, sample in zip(batch, self._compute([indices[p] for p in batch]), strict=True):
                out[p] = sample
        return out  # type: ignore[return-value]

    def _compute(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        states = capture_batch(self.target.model, [self.rows[i].input_ids for i in indices], self.layer_ids,
                               self.target.device)
        # clone(): captured under inference_mode; a normal tensor can be saved for backward by the draft
        return [{"hidden_states": hs.to(self.dtype).clone(),
                 "token_ids": torch.tensor(self.rows[i].input_ids, dtype=torch.int64),
                 "loss_mask": torch.tensor(self.rows[i].loss_mask, dtype=torch.int64)}
                for i, hs in zip(indices, states, strict=True)]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle_seed is not None:
            random.Random(f"{self.shuffle_seed}:{self.epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = self.order()
        window = max(1, self.batch_size * 4)
        for start in range(0, len(order), window):
            yield from self.get_many(order[start: start + window])
