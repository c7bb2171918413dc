"""Extract target hidden states at chosen layer ids into vLLM-format sample files, resumably and in bounded memory."""

# `extract_dataset` is the one driver: it renders the dataset, resolves the layer ids and writes the manifest
# header, then hands the rows to a backend. The transformers backend (default; CPU or CUDA) sorts samples by length,
# packs them into right-padded batches under a token budget, runs the decoder only (no lm_head) with hooks at the
# requested layers (`engine.targets.capture.capture_hidden_states`) and writes one `hs_{i}.safetensors` per sample
# (`engine.data.store.files`). The vLLM backend (`engine.data.extract.vllm`) writes through the same `ExtractionRun`
# (engine.data.extract.run).

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.data.extract.layer_ids import resolve_layer_ids
from engine.data.extract.run import (
    ExtractionProgress,
    ExtractionRun,
    TargetInfo,
    build_header,
    dataset_name,
    estimate_bytes,
    log_done,
)
from engine.data.extract.vllm import extract_rows_vllm, refuse_unsupported_target, require_vllm
from engine.data.options import BACKENDS, DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS, ExtractOptions
from engine.data.render.chat import RenderedRow, render_dataset
from engine.data.store.files import HiddenStatesDataset, load_sample
from engine.errors import WorkbenchError
from engine.jobs import reporter
from engine.targets.capture import capture_hidden_states
from engine.targets.dtypes import pick_device
from engine.targets.loading import load_target
from engine.targets.resolve import resolve_target

__all__ = ["HiddenStatesDataset", "load_sample", "extract_dataset", "extract_hidden_states", "ExtractionRun",
           "TargetInfo", "plan_padded_batches", "estimate_bytes", "capture_batch"]



# -- transformers backend ----------------------------------------------------------------------------


def plan_padded_batches(lengths: Sequence[int], batch_size: int = DEFAULT_BATCH_SIZE,
                 batch_tokens: int = DEFAULT_BATCH_TOKENS, order: Sequence[int] | None = None) -> list[list[int]]:
    """Group sample positions into batches, longest first, so that batch * longest <= batch_tokens.

    `order` (positions) defaults to all samples sorted by length, descending; similar lengths share a batch,
    so padding is small. A sample longer than the budget gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if order is None else list(order)
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        if current and (len(current) + 1 > batch_size or max(longest, n) * (len(current) + 1) > batch_tokens):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def capture_batch(model, sequences: Sequence[Sequence[int]], layer_ids: Sequence[int],
                  device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Hidden states [T_i, L, H] of each sequence, from one right-padded forward (padding dropped)."""
    lengths = [len(s) for s in sequences]
    longest = max(lengths)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)  # [B, T]; pad id is irrelevant (masked)
    mask = torch.zeros(len(sequences), longest, dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids[b, : len(seq)] = torch.as_tensor(seq)
        mask[b, : len(seq)] = 1
    attention = None if min(lengths) == longest else mask.to(device)  # all full: let SDPA take the causal path
    hs = capture_hidden_states(model, ids.to(device), layer_ids, attention_mask=attention)  # [B, T, L, H]
    return [hs[b, :n] for b, n in enumerate(lengths)]


def extract_hidden_states(target, rows: Sequence[RenderedRow], options: ExtractOptions, layer_ids: Sequence[int], *,
                          header_extra: dict | None = None, progress: bool = True,
                          on_sample: Callable[[int], None] | None = None) -> dict:
    """Extract `rows` with a loaded `target` (transformers) into `options.out` (its dtype, batch_size,
    batch_tokens and overwrite); return the final manifest.

    `header_extra` adds provenance (dataset, split, max_length, seed, val_fraction, algo) to the manifest.
    `on_sample(index)` is called after each sample is on disk.
    """
    layer_ids = sorted(set(int(i) for i in layer_ids))
    header = build_header(TargetInfo.from_target(target), layer_ids, options.dtype, backend="transformers",
                          source=header_extra)
    with ExtractionRun(options.out, header, rows, overwrite=options.overwrite) as run:
        todo = run.pending
        batches = plan_padded_batches([rows[i].num_tokens for i in todo], options.batch_size, options.batch_tokens)
        with ExtractionProgress(run, sum(rows[i].num_tokens for i in todo), progress) as bar:
            for batch in batches:
                indices = [todo[p] for p in batch]
                states = capture_batch(target.model, [rows[i].input_ids for i in indices], layer_ids, target.device)
                for i, hs in zip(indices, states, strict=True):
                    run.write(i, hs)
                    bar.advance(rows[i].num_tokens)
                    if on_sample is not None:
                        on_sample(i)
    log_done(run)
    return run.manifest


# -- the whole pipeline, as the CLI and the UI call it --------------------------------------------------


def extract_dataset(options: ExtractOptions, *, progress: bool = True) -> dict:
    """Render `options.dataset` with its target's template and extract its hidden states into `options.out`;
    return the manifest."""
    o = options
    target, backend, device = o.target, o.backend, o.device
    if backend not in BACKENDS:
        raise WorkbenchError(f"unknown backend '{backend}'", hint=f"use one of {', '.join(BACKENDS)}")
    if backend == "vllm":
        from transformers import AutoConfig, AutoTokenizer


        require_vllm()
        ref = resolve_target(target)
        config = AutoConfig.from_pretrained(ref.path)
        refuse_unsupported_target(config.get_text_config().to_dict(), ref.path)
        info = TargetInfo.from_config(ref, config)
        tokenizer, tgt = AutoTokenizer.from_pretrained(ref.path), None
    else:
        device = pick_device(device)
        reporter().phase("loading target")
        tgt = load_target(target, dtype=o.target_dtype or ("fp32" if device == "cpu" else "bf16"), device=device)
        info, tokenizer = TargetInfo.from_target(tgt), tgt.tokenizer
    layer_ids = resolve_layer_ids(info.num_layers, o.layers, o.algo)
    reporter().phase("rendering dataset")
    rows, summary, _ = render_dataset(o.dataset, tokenizer, split=o.split, max_samples=o.max_samples,
                                      max_length=o.max_length, val_fraction=o.val_fraction, seed=o.seed)
    if not rows:
        raise WorkbenchError(f"no usable rows in {o.dataset} (split {o.split})", hint=summary.format())
    extra = {"dataset": dataset_name(o.dataset), "split": o.split, "max_length": o.max_length, "seed": o.seed,
             "val_fraction": o.val_fraction, "algo": o.header_algo()}
    if backend == "vllm":
        return extract_rows_vllm(info, rows, o, layer_ids, header_extra=extra, progress=progress)
    return extract_hidden_states(tgt, rows, o, layer_ids, header_extra=extra, progress=progress)
