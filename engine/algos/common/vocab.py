"""Draft vocabulary selection (the most frequent loss-masked target tokens) with speculators' d2t/t2d maps, and the
mask token of parallel drafters' slots."""

from __future__ import annotations

import torch

from engine.errors import WorkbenchError


def select_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """Target ids of the draft vocabulary, ascending.

    Sort by (-count, id), keep the top `draft_vocab_size`; if fewer tokens were seen, pad with the
    smallest unused ids; then sort ascending (draft id i <-> i-th smallest selected target id).
    """
    vocab = counts.numel()
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size must be in 1..{vocab}, got {draft_vocab_size}")
    counts = counts.long()
    # stable sort on id, then on -count keeps ties in ascending id order
    order = torch.sort(-counts, stable=True).indices
    seen = order[counts[order] > 0][:draft_vocab_size]
    if seen.numel() < draft_vocab_size:
        unused = torch.ones(vocab, dtype=torch.bool)
        unused[seen] = False
        seen = torch.cat([seen, unused.nonzero().flatten()[: draft_vocab_size - seen.numel()]])
    return torch.sort(seen).values


def vocab_maps(selected: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] int64 offsets: target = draft + d2t[draft]; t2d [V] bool membership)."""
    d2t = selected.long() - torch.arange(selected.numel(), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[selected] = True
    return d2t, t2d


def selected_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    return torch.arange(d2t.numel(), dtype=torch.long) + d2t.long()


def reduced_vocab(token_counts: torch.Tensor | None, draft_vocab_size: int, vocab_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(selected target ids, d2t, t2d) of a reduced draft vocabulary, or a clear error without frequencies."""
    if token_counts is None:
        raise WorkbenchError("a reduced draft vocabulary needs token frequencies",
                             hint="extract data first (it writes token_freq.safetensors) or use the full vocab")
    selected = select_draft_vocab(token_counts, draft_vocab_size)
    return (selected, *vocab_maps(selected, vocab_size))


def choose_mask_token(target, explicit: int | None = None) -> int:
    """The token of the mask slots, in speculators' order of preference: an explicit id, the tokenizer's mask
    token, a spare embedding row beyond the tokenizer, then pad, unk and eos."""
    if explicit is not None:
        if not 0 <= explicit < target.vocab_size:
            raise WorkbenchError(f"mask_token_id {explicit} is outside the vocabulary (0..{target.vocab_size - 1})")
        return int(explicit)
    tok = getattr(target, "tokenizer", None)
    if tok is None and getattr(target, "ref", None) is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(target.ref.path)
    if tok is not None:
        if getattr(tok, "mask_token_id", None) is not None:
            return int(tok.mask_token_id)
        if len(tok) < target.vocab_size:
            return len(tok)  # an embedding row no token uses
        for name in ("pad_token_id", "unk_token_id", "eos_token_id"):
            value = getattr(tok, name, None)
            if value is not None:
                return int(value)
    raise WorkbenchError("no mask token could be chosen for this target", hint="pass --mask-token-id")
