"""Regenerate answers and extract their hidden states in one pass: the layers are kept while the target generates."""

# `regenerate_and_extract` writes what `regenerate` followed by `extract --split all` on its JSONL writes (the
# same JSONL rows; an extraction folder of `hs_{i}.safetensors`, manifest.json and token_freq.safetensors), but
# runs no second forward over the conversations. Greedy generation (`CapturingAnswerer`) runs each prompt alone, then
# decodes the batch's answers together (an answer that ends leaves the batch): on the fused decoder's batch cache
# (engine.generate.fused_decoder, one linear per weight for all rows) where the target allows it, else with
# transformers on the joined, left-padded KV caches (attention mask, position ids); either way it keeps the hidden
# states of the requested layers for every token it feeds the target. A conversation's rendered tokens (what `extract`
# would read from the JSONL) are then the fed tokens up to where they differ (the end-of-turn marker after the answer,
# or an answer whose text re-tokenises differently), and only the rest, usually 1-2 tokens, is run through the target
# on that row's KV cache. A multi-turn conversation's later prompts (its earlier answers and the next user turn) are
# prefilled in the next turn's generation, as `regenerate` does; the last turn's states cover the whole conversation.
# Resumable and owned like both steps: a conversation in the JSONL without its sample file (a crash between the
# two writes) is extracted the ordinary way on the next run.

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from engine.data.answers.regenerate import RegenerateSummary, answer_of, chat_prompts, regenerate, stop_token_ids
from engine.data.extract.dataset import DEFAULT_BATCH_TOKENS, capture_batch, plan_padded_batches
from engine.data.extract.run import (
    ExtractionRun,
    TargetInfo,
    build_header,
    check_disk,
    dataset_name,
    estimate_bytes,
    log_done,
)
from engine.data.options import RegenerateOptions
from engine.data.render.chat import RenderedRow, render_dataset, render_rows
from engine.data.render.datasets import DEFAULT_VAL_FRACTION
from engine.data.store.files import MANIFEST, TOKEN_FREQ, sample_indices, sample_path
from engine.errors import WorkbenchError
from engine.fsutil import claim_names
from engine.generate.fused_decoder import FusedBatch, greedy_batch, stacked_capture
from engine.generate.kernel_choice import fused_batch_problem
from engine.targets.capture import LayerCapture
from engine.targets.dtypes import parse_dtype

log = logging.getLogger(__name__)


def conversation_key(messages: Sequence[dict]) -> str:
    """What identifies a conversation's messages (roles and contents), to find its captured states again."""
    return json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def _row_cache(cache, row: int, start: int, end: int, config):
    """A one-row DynamicCache holding positions [start, end) of batch row `row`; None for non-plain caches."""
    from transformers import DynamicCache

    if not _plain(cache):
        return None  # sliding-window or other layer kinds: the caller runs the whole conversation instead
    out = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys[row: row + 1, :, start:end].clone(), layer.values[row: row + 1, :, start:end].clone(), i)
    return out


def _plain(cache) -> bool:
    """A cache of plain growing layers (no sliding window, no linear attention): rows can be sliced and joined."""
    return all(type(layer).__name__ == "DynamicLayer" for layer in cache.layers)


def _join_caches(caches: list, config) -> tuple[object, list[int]]:
    """One left-padded batch cache [b, heads, S, d] from one-row caches; (cache, left padding of each row)."""
    from transformers import DynamicCache

    width = max(c.get_seq_length() for c in caches)
    pads = [width - c.get_seq_length() for c in caches]
    out = DynamicCache(config=config)
    for i in range(len(caches[0].layers)):
        keys = torch.cat([torch.nn.functional.pad(c.layers[i].keys, (0, 0, pad, 0))
                          for c, pad in zip(caches, pads, strict=True)])
        values = torch.cat([torch.nn.functional.pad(c.layers[i].values, (0, 0, pad, 0))
                            for c, pad in zip(caches, pads, strict=True)])
        out.update(keys, values, i)
    return out, pads


@dataclass
class _Answering:
    """One call's conversations as decoding grows them: prompts, new tokens and captured states per conversation."""

    histories: Sequence[list[dict]]
    prompts: list[list[int]]
    stops: set[int]
    max_new_tokens: int
    new: list[list[int]]                # per conversation: answer tokens so far
    states: list[list[torch.Tensor]]    # per conversation: [t, L, H] chunks, in order


class CapturingAnswerer:
    """Drop-in for `regenerate.generate_answers` (greedy) that keeps the hidden states of `layer_ids`.

    After each call, `states[conversation_key(history + [answer])]` holds the conversation's rendered row (as
    `extract` renders it, truncated to `max_length`) and its hidden states [T, L, H] in `dtype`: prompt and
    fed answer tokens from the generation's forwards, the rest from a forward on that row's KV cache. `fused`:
    decode on the fused decoder (None: where `fused_batch_problem` finds no reason not to).
    """

    def __init__(self, target, layer_ids: Sequence[int], *, max_length: int | None, dtype: torch.dtype,
                 fused: bool | None = None):
        self.target = target
        self.layer_ids = sorted(set(int(i) for i in layer_ids))
        self.max_length = max_length
        self.dtype = dtype
        problem = fused_batch_problem(target.model)
        self.fused = problem is None if fused is None else fused and problem is None
        if fused is None and problem:
            log.info("one pass decodes with transformers: %s", problem)
        self.backend = "fused-onepass" if self.fused else "transformers-onepass"
        self.states: dict[str, tuple[RenderedRow | None, torch.Tensor | None]] = {}
        self.fed_tokens = 0  # tokens run through the target while generating
        self.tail_tokens = 0  # tokens run afterwards (end-of-turn markers, re-tokenised answers)

    @torch.inference_mode()
    def __call__(self, target, histories: Sequence[list[dict]], *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, width: int | None = None) -> list[tuple[str, int, bool]]:
        if temperature > 0:
            raise WorkbenchError("one-pass extraction generates greedily (temperature 0)",
                                 hint="drop --extract-to to sample, then run `extract` on the regenerated file")
        prompts = chat_prompts(target.tokenizer, histories)
        if self.fused:
            return self._generate_fused(histories, prompts, stop_token_ids(target), max_new_tokens, width)
        return self._generate(histories, prompts, stop_token_ids(target), max_new_tokens)

    def _generate(self, histories, prompts: list[list[int]], stops: set[int],
                  max_new_tokens: int) -> list[tuple[str, int, bool]]:
        """Greedy decoding with hooks. Each prompt runs alone (no padding: its states are those of a plain forward);
        the answers are then decoded together on the joined, left-padded caches, and a row leaves the batch (with
        its cache) when its answer ends."""
        from transformers import DynamicCache

        model, device = self.target.model, self.target.device
        states: list[list[torch.Tensor]] = [[] for _ in prompts]  # per conversation: [t, L, H] chunks, in order
        new: list[list[int]] = [[] for _ in prompts]
        answers: list = [None] * len(prompts)
        caches = []
        with LayerCapture(model, self.layer_ids) as capture:
            for b, prompt in enumerate(prompts):
                cache = DynamicCache(config=model.config)
                logits = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True,
                               logits_to_keep=1).logits[0, -1]  # [V]
                states[b].append(capture.stacked()[0].to(self.dtype))  # [T_b, L, H]
                new[b].append(int(logits.argmax()))
                self.fed_tokens += len(prompt)
                caches.append(cache)
        work = _Answering(histories, prompts, stops, max_new_tokens, new, states)
        rows = []
        for b in range(len(prompts)):  # an answer of one token ends here
            if new[b][-1] in stops or max_new_tokens == 1:
                answers[b] = self._finish(histories[b], prompts[b], new[b], stops, states[b][0],
                                          partial(self._tail, cache=caches[b], row=0, pad=0))
            else:
                rows.append(b)
        if len(rows) == 1 or not all(_plain(caches[b]) for b in rows):  # cannot join: one conversation at a time
            for b in rows:
                answers[b] = self._decode(work, [b], caches[b], [0])[b]
        elif rows:
            cache, pads = _join_caches([caches[b] for b in rows], model.config)
            caches.clear()
            answers_of = self._decode(work, rows, cache, pads)
            for b in rows:
                answers[b] = answers_of[b]
        return answers

    def _decode(self, work: _Answering, rows: list[int], cache, pads: list[int]) -> dict[int, tuple[str, int, bool]]:
        """Decode conversations `rows` (batch row j = rows[j], left padding pads[j]) from their first answer token
        on; returns {conversation: (text, new tokens, ended)}."""
        model, device = self.target.model, self.target.device
        histories, prompts, new, states, stops = work.histories, work.prompts, work.new, work.states, work.stops
        max_new_tokens = work.max_new_tokens
        width = cache.get_seq_length()
        mask = torch.zeros(len(rows), width + 1, dtype=torch.long, device=device)  # [b, S + 1]
        for j, pad in enumerate(pads):
            mask[j, pad:] = 1
        positions = torch.tensor([[len(prompts[b])] for b in rows], device=device)  # [b, 1]
        x = torch.tensor([[new[b][-1]] for b in rows], device=device)  # [b, 1]
        answers: dict[int, tuple[str, int, bool]] = {}
        capture = LayerCapture(model, self.layer_ids)
        for step in range(1, max_new_tokens):
            with capture:
                logits = model(input_ids=x, attention_mask=mask, position_ids=positions, past_key_values=cache,
                               use_cache=True, logits_to_keep=1).logits[:, -1]  # [b, V]
            hidden = capture.stacked().to(self.dtype)  # [b, 1, L, H]
            nxt = logits.argmax(-1).tolist()  # [b]
            for j, b in enumerate(rows):
                states[b].append(hidden[j])
                new[b].append(nxt[j])
            self.fed_tokens += len(rows)
            ending = [j for j, b in enumerate(rows) if nxt[j] in stops or step == max_new_tokens - 1]
            for j in ending:
                b = rows[j]
                answers[b] = self._finish(histories[b], prompts[b] + new[b][:-1], new[b], stops,
                                          torch.cat(states[b]), partial(self._tail, cache=cache, row=j, pad=pads[j]))
                states[b] = []
            keep = [j for j in range(len(rows)) if j not in ending]
            if not keep:
                break
            if ending:  # the rows that ended leave the batch; padding no row needs any more goes too
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions[index]
                rows, pads, nxt = [rows[j] for j in keep], [pads[j] for j in keep], [nxt[j] for j in keep]
                cut = min(pads)
                if cut:
                    for layer in cache.layers:
                        layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
                    mask, pads = mask[:, cut:], [pad - cut for pad in pads]
            x = torch.tensor(nxt, device=device)[:, None]  # [b, 1]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            positions = positions + 1
        return answers

    def _generate_fused(self, histories, prompts: list[list[int]], stops: set[int], max_new_tokens: int,
                        width: int | None) -> list[tuple[str, int, bool]]:
        """`_generate` on the fused decoder's batch of `width` rows (engine.generate.fused_decoder.greedy_batch)."""
        answers: list = [None] * len(prompts)
        for end in greedy_batch(self.target.model, prompts, stops, max_new_tokens, width=width,
                                capture=self.layer_ids, dtype=self.dtype):
            b = end.index
            self.fed_tokens += len(prompts[b]) + len(end.new) - 1
            answers[b] = self._finish(histories[b], prompts[b] + end.new[:-1], end.new, stops, end.states,
                                      partial(self._fused_tail, batch=end.batch, row=end.row))
        return answers

    def _finish(self, history: list[dict], fed: list[int], new: list[int], stops: set[int], hidden: torch.Tensor,
                tail) -> tuple[str, int, bool]:
        """(text, new tokens, ended) of a finished answer; keeps its conversation's states (`_keep`)."""
        answer = answer_of(self.target.tokenizer, new, stops)
        if answer[0]:
            self._keep(history + [{"role": "assistant", "content": answer[0]}], fed, hidden, tail)
        return answer

    def _keep(self, messages: list[dict], fed: list[int], hidden: torch.Tensor, tail) -> None:
        """Store the rendered conversation and its states [T, L, H]: the fed tokens', then the rest from
        `tail(ids, p)` (the states of ids[p:] on the row's cache of its first p tokens)."""
        rendered = render_rows(self.target.tokenizer, [{"id": "onepass", "messages": messages}], self.max_length)
        key = conversation_key(messages)
        if not rendered:  # no loss token (cut by max_length) or a template error: `extract` skips it too
            self.states[key] = (None, None)
            return
        row = rendered[0]
        p = common_prefix(fed, row.input_ids)  # hidden [len(fed), L, H]
        head = hidden[:p]
        if p < row.num_tokens:
            rest = tail(row.input_ids, p)
            head = torch.cat([head, rest], dim=0) if rest.shape[0] < row.num_tokens else rest
        self.states[key] = (row, head)

    def _tail(self, ids: list[int], p: int, *, cache, row: int, pad: int) -> torch.Tensor:
        """States of ids[p:] [T - p, L, H] on batch row `row`'s cache of its first p tokens (all of ids without a
        cache)."""
        model, device = self.target.model, self.target.device
        row_cache = _row_cache(cache, row, pad, pad + p, model.config) if p > 0 else None
        if row_cache is None:
            self.tail_tokens += len(ids)
            return capture_batch(model, [ids], self.layer_ids, device)[0].to(self.dtype)
        self.tail_tokens += len(ids) - p
        x = torch.tensor([ids[p:]], device=device)  # [1, T - p]
        positions = torch.arange(p, len(ids), device=device)[None]
        with LayerCapture(model, self.layer_ids, stop_early=True) as capture:
            capture.decoder(input_ids=x, position_ids=positions, past_key_values=row_cache, use_cache=True)
        return capture.stacked()[0].to(self.dtype)

    def _fused_tail(self, ids: list[int], p: int, *, batch: FusedBatch, row: int) -> torch.Tensor:
        """`_tail` on the fused batch's row `row` (the row ends: its cache past p is overwritten)."""
        self.tail_tokens += len(ids) - p
        _, captured = batch.row(row, p).forward(torch.tensor(ids[p:]), self.layer_ids)
        return stacked_capture(captured, self.layer_ids, self.dtype)  # [T - p, L, H]


class GrowingExtractionRun(ExtractionRun):
    """An `ExtractionRun` whose rows arrive while it runs (one per regenerated conversation that renders).

    It claims the sample names up to `planned` before anything is written, so a user's file under one of those
    names blocks the run as it blocks `extract`."""

    def __init__(self, out, header: dict, rows: list[RenderedRow], *, planned: int, overwrite: bool = False):
        super().__init__(out, header, rows, overwrite=overwrite, check_space=False)
        self.planned = planned
        self.finished = False  # set when every conversation is regenerated: until then the folder is not complete

    def remaining(self) -> list[int]:
        """Rows without a sample; until `finished`, the rows still to come count too (as the index of the next)."""
        return super().remaining() + ([] if self.finished else [len(self.rows)])

    def _claim(self) -> None:
        names = [MANIFEST, TOKEN_FREQ, *(sample_path(self.out, i).name
                                         for i in sorted(set(range(self.planned)) | set(sample_indices(self.out))))]
        claim_names(self.out, names, kind="hidden-states", overwrite=self.overwrite, overwrite_flag="--overwrite")

    def add(self, row: RenderedRow, hidden_states: torch.Tensor) -> int:
        """Append `row` as the next sample and write its states [T, L, H]; returns its index."""
        self.rows.append(row)
        self.header["planned_samples"] = max(self.header["planned_samples"], len(self.rows))
        self.write(len(self.rows) - 1, hidden_states)
        return len(self.rows) - 1


def _extract_missing(run: ExtractionRun, target, layer_ids: Sequence[int]) -> int:
    """Extract (the ordinary way) rows of the JSONL whose sample file is missing: a crash between the writes."""
    todo = list(run.pending)
    for batch in plan_padded_batches([run.rows[i].num_tokens for i in todo], batch_tokens=DEFAULT_BATCH_TOKENS):
        indices = [todo[p] for p in batch]
        for i, hs in zip(indices, capture_batch(target.model, [run.rows[i].input_ids for i in indices], layer_ids,
                                                target.device), strict=True):
            run.write(i, hs)
    return len(todo)


def regenerate_and_extract(target, rows: Sequence[dict], options: RegenerateOptions, layer_ids: Sequence[int], *,
                           overwrite: bool = False, progress: bool = True, fused: bool | None = None
                           ) -> RegenerateSummary:
    """`regenerate` into the JSONL `options.out` and, in the same pass, `extract --split all` of it into
    `options.extract_to`.

    Greedy only. `max_length` bounds prompt + answer while generating (as `regenerate`); `extract_max_length`
    truncates the rendered conversations (as `extract --max-length`). The summary's `extracted` is the
    number of samples in the folder. `fused`: as `CapturingAnswerer`'s (False: transformers decodes)."""
    if options.extract_to is None:
        raise WorkbenchError("one pass needs a folder for the hidden states", hint="pass --extract-to DIR")
    options = options.model_copy(update={"temperature": 0.0})  # greedy: the states are those of the kept answer
    out, folder = Path(options.out), Path(options.extract_to)
    extract_max_length, dtype = options.extract_max_length, options.dtype
    layer_ids = sorted(set(int(i) for i in layer_ids))
    header = build_header(TargetInfo.from_target(target), layer_ids, dtype, backend="transformers",
                          source={"dataset": dataset_name(str(out)), "split": "all", "max_length": extract_max_length,
                                  "seed": 0, "val_fraction": DEFAULT_VAL_FRACTION, "algo": options.header_algo()})
    done: list[RenderedRow] = []
    if out.is_file():  # resume: the rows `extract` would render from what is already regenerated
        done, _, _ = render_dataset(str(out), target.tokenizer, split="all", max_length=extract_max_length)
    answerer = CapturingAnswerer(target, layer_ids, max_length=extract_max_length, dtype=parse_dtype(dtype),
                                 fused=fused)
    with GrowingExtractionRun(folder, header, list(done), planned=len(done) + len(rows), overwrite=overwrite) as run:
        if run.pending:
            log.info("extracting %d regenerated conversations whose samples are missing", len(run.pending))
            _extract_missing(run, target, layer_ids)
        check_disk(folder, estimate_bytes(len(rows) * options.max_new_tokens, len(rows), len(layer_ids),
                                          target.hidden_size, dtype))  # answers alone: a lower bound

        def write(written: list[dict]) -> None:  # after each batch's rows are in the JSONL
            for r in written:
                key = conversation_key(r["messages"])
                if key not in answerer.states:  # not captured (not expected): extracted the ordinary way, in order
                    rendered = render_rows(target.tokenizer, [r], extract_max_length)
                    answerer.states[key] = (rendered[0], capture_batch(target.model, [rendered[0].input_ids],
                                                                       layer_ids, target.device)[0]) \
                        if rendered else (None, None)
                row, hs = answerer.states.pop(key)
                if row is not None:
                    run.add(RenderedRow(str(r["id"]), row.input_ids, row.loss_mask, row.truncated), hs)
            answerer.states.clear()

        summary = regenerate(target, rows, options, progress=progress, answer=answerer, on_rows=write)
        run.finished = True
    log_done(run)
    summary.extracted = run.manifest["samples"]
    log.info("one pass: %d tokens fed while generating, %d afterwards", answerer.fed_tokens, answerer.tail_tokens)
    return summary
