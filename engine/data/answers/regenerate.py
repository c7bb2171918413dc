"""Re-answer every user turn with the target (on-policy data): a JSONL of `messages` rows, resumable per batch."""

# For a multi-turn conversation the target answers user turn 1, then sees its own answer as history when it
# answers user turn 2, and so on; the original assistant turns are dropped. Conversations are generated in
# batches: greedy ones on the fused decoder's batch where the target takes it (FUSED_GROUP batches per call, a row
# refilled as its answer ends), else left-padded, KV-cached `model.generate`. Each call's rows are appended in one
# write and fsynced, and a re-run skips the ids already in the file (a line cut by a crash is removed first). A file
# that regenerate did not write is refused, never truncated.

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.data.options import RegenerateOptions
from engine.errors import WorkbenchError
from engine.generate.fused_decoder import greedy_batch
from engine.generate.kernel_choice import fused_batch_problem
from engine.generate.sampling import SamplingParams
from engine.jobs import reporter
from engine.targets.resolve import resolve_target

log = logging.getLogger(__name__)


@dataclass
class RegenerateSummary:
    out: str
    written: int = 0  # conversations written by this run
    already_done: int = 0  # found in the file from an earlier run
    answers: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    skipped: Counter = field(default_factory=Counter)
    cut_at_max_new_tokens: int = 0  # answers that hit --max-new-tokens before the end-of-turn token
    extracted: int | None = None  # samples in the extraction folder (one-pass: `engine.data.answers.onepass`)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict:
        return {"out": self.out, "written": self.written, "already_done": self.already_done, "answers": self.answers,
                "new_tokens": self.new_tokens, "tokens_per_s": round(self.tokens_per_s, 1),
                "skipped": dict(self.skipped), "cut_at_max_new_tokens": self.cut_at_max_new_tokens,
                **({} if self.extracted is None else {"extracted": self.extracted})}


# -- the output file ---------------------------------------------------------------------------------


_ROW_START = b'{"id": '  # how every row `append_rows` writes begins (json.dumps of a dict whose first key is id)


def is_own_row(row) -> bool:
    """A row `regenerate` wrote: {"id", "messages": [...], "regenerated": {"target", ...}}."""
    return (isinstance(row, dict) and "id" in row and isinstance(row.get("messages"), list)
            and isinstance(row.get("regenerated"), dict) and "target" in row["regenerated"])


def _refuse_foreign(path: Path, what: str) -> WorkbenchError:
    return WorkbenchError(
        f"--out already holds data that `regenerate` did not write ({what}); nothing was changed", where=str(path),
        hint="give a new file, or the output of an earlier regenerate run to resume it (rows are appended to it)")


def scan_output(path: Path, data: bytes) -> tuple[set[str], int]:
    """(ids done, length to keep) of an output file's bytes; WorkbenchError if regenerate did not write it."""
    end = data.rfind(b"\n") + 1
    done = set()
    for number, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # includes UnicodeDecodeError
            raise _refuse_foreign(path, f"line {number} is not JSON") from None
        if not is_own_row(row):
            raise _refuse_foreign(path, f"line {number} is not a regenerated row (id, messages, regenerated)")
        done.add(str(row["id"]))
    tail = data[end:]
    if tail:
        try:
            complete = json.loads(tail)
        except ValueError:
            complete = None  # cut: it may be the start of one of our rows
        if not tail.startswith(_ROW_START) or (complete is not None and not is_own_row(complete)):
            raise _refuse_foreign(path, "its last line, without a newline, is not part of a regenerated row")
    return done, end


def check_output(path: str | Path) -> None:
    """Refuse early (before a model is loaded) an --out that regenerate could not append to."""
    path = Path(path)
    if path.is_dir():
        raise WorkbenchError("--out is a folder, not a file", where=str(path), hint="give a .jsonl file path")
    if path.is_file():
        scan_output(path, path.read_bytes())


def open_output(path: Path):
    """Open `path` for appending under an exclusive lock; drop a trailing partial line; return (file, done ids).

    Only a file `regenerate` wrote is resumed or repaired: every complete line must be one of its rows and a
    trailing partial line must be the start of one (a write cut by a crash). Anything else is refused
    untouched, so pointing --out at an unrelated file never truncates it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        raise WorkbenchError("--out is a folder, not a file", where=str(path), hint="give a .jsonl file path")
    f = open(path, "a+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise WorkbenchError(f"{path} is being written by another job",
                             hint="wait for it to finish, stop it, or choose another --out file") from None
    try:
        f.seek(0)
        data = f.read()
        done, end = scan_output(path, data)
        if end < len(data):
            log.warning("%s ends with a partial line (an interrupted write): removing it", path)
            f.truncate(end)
            os.fsync(f.fileno())
    except BaseException:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()
        raise
    return f, done


def append_rows(f, rows: list[dict]) -> None:
    """Append whole rows in one write, then flush and fsync (a crash leaves at most one partial last line)."""
    if rows:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


# -- generation ----------------------------------------------------------------------------------------


def stop_token_ids(target) -> set[int]:
    ids = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if target.tokenizer.eos_token_id is not None:
        ids.add(int(target.tokenizer.eos_token_id))
    return ids


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] ids and attention mask, padded on the left (generation continues every row at the right end)."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids[b, longest - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
        mask[b, longest - len(seq):] = 1
    return ids, mask


@torch.inference_mode()
def generate_answers(target, histories: Sequence[list[dict]], *, max_new_tokens: int, temperature: float,
                     top_p: float = 1.0, width: int | None = None) -> list[tuple[str, int, bool]]:
    """(answer text, new tokens, ended by a stop token) for each chat history, `width` at a time (all by default):
    greedy answers on the fused decoder where `decodes_fused`, else transformers' `generate`."""
    if decodes_fused(target, temperature):
        return _fused_answers(target, histories, max_new_tokens, width)
    return transformers_answers(target, histories, max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=top_p, width=width)


def transformers_answers(target, histories: Sequence[list[dict]], *, max_new_tokens: int, temperature: float,
                         top_p: float = 1.0, width: int | None = None) -> list[tuple[str, int, bool]]:
    """`generate_answers` by transformers' batched, left-padded `generate` (sampling, GPUs, any family), one
    `generate` per `width` histories."""
    width = width or len(histories)
    if len(histories) > width:
        return [a for k in range(0, len(histories), width)
                for a in transformers_answers(target, histories[k: k + width], max_new_tokens=max_new_tokens,
                                              temperature=temperature, top_p=top_p)]
    tok = target.tokenizer
    prompts = chat_prompts(tok, histories)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    ids, mask = left_pad(prompts, pad_id)
    stops = stop_token_ids(target)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else \
        {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=sorted(stops),
                                use_cache=True, **sampling)
    return [answer_of(tok, row, stops) for row in out[:, ids.shape[1]:].tolist()]  # new tokens [B, <= max_new]


transformers_answers.backend = "transformers"  # the rows' `regenerated.backend` when passed as `answer`


FUSED_GROUP = 4  # batches of conversations per call on the fused batch (written to the JSONL together)


def decodes_fused(target, temperature: float) -> bool:
    """Whether `generate_answers` decodes on the fused decoder's batch: greedy, on a target it takes (a CPU)."""
    model = getattr(target, "model", None)  # None: a tokenizer only (another engine answers)
    return temperature == 0 and model is not None and fused_batch_problem(model) is None


def _fused_answers(target, histories: Sequence[list[dict]], max_new_tokens: int,
                   width: int | None) -> list[tuple[str, int, bool]]:
    """Greedy `generate_answers` on the fused decoder's batch (engine.generate.fused_decoder.greedy_batch)."""
    prompts, stops = chat_prompts(target.tokenizer, histories), stop_token_ids(target)
    new: list[list[int]] = [[] for _ in prompts]
    for end in greedy_batch(target.model, prompts, stops, max_new_tokens, width=width):
        new[end.index] = end.new
    return [answer_of(target.tokenizer, row, stops) for row in new]


def chat_prompts(tok, histories: Sequence[list[dict]]) -> list[list[int]]:
    """Each history's prompt ids, the chat template's generation prompt added."""
    return [tok(tok.apply_chat_template(h, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"] for h in histories]


def answer_of(tok, new: list[int], stops: set[int]) -> tuple[str, int, bool]:
    """(text, new tokens, ended) of an answer's generated ids: cut at the first stop token, which counts."""
    cut = next((k for k, t in enumerate(new) if t in stops), None)
    kept = new if cut is None else new[:cut]
    return tok.decode(kept, skip_special_tokens=True).strip(), len(kept) + (cut is not None), cut is not None


def user_groups(messages: list[dict]) -> list[list[dict]]:
    """The turns to answer: each group is [system turns..., user turn]; original assistant turns are dropped."""
    groups: list[list[dict]] = []
    pending: list[dict] = []
    for m in messages:
        if m["role"] == "assistant":
            continue
        pending.append({"role": m["role"], "content": m["content"]})
        if m["role"] == "user":
            groups.append(pending)
            pending = []
    return groups


def regenerate_batch(target, rows: Sequence[dict], options: RegenerateOptions, summary: RegenerateSummary,
                     answer=None) -> list[dict]:
    """Answer every user turn of a batch of conversations, turn by turn, with the target's own history.

    `answer` replaces `generate_answers` (e.g. a `VllmAnswerer`)."""
    answer = answer or generate_answers
    max_new_tokens, max_length, max_turns = options.max_new_tokens, options.max_length, options.max_turns
    tok = target.tokenizer
    plans = [user_groups(r["messages"]) for r in rows]
    histories: list[list[dict]] = [[] for _ in rows]
    alive = [True] * len(rows)
    turns = max((len(g) for g in plans), default=0)
    turns = min(turns, max_turns) if max_turns else turns
    for t in range(turns):
        active = []
        for b, groups in enumerate(plans):
            if not alive[b] or t >= len(groups):
                continue
            candidate = histories[b] + groups[t]
            if max_length is not None and _prompt_tokens(tok, candidate) + max_new_tokens > max_length:
                alive[b] = False  # no room to answer this turn within max_length: keep what is done
                continue
            histories[b] = candidate
            active.append(b)
        if not active:
            break
        answers = answer(target, [histories[b] for b in active], max_new_tokens=max_new_tokens,
                         temperature=options.temperature, top_p=options.top_p, width=options.batch_size)
        for b, (text, n_new, ended) in zip(active, answers, strict=True):
            summary.new_tokens += n_new
            summary.cut_at_max_new_tokens += int(not ended)
            if not text:
                summary.skipped["empty answer (conversation cut there)"] += 1
                histories[b] = histories[b][: len(histories[b]) - len(plans[b][t])]  # drop the unanswered turn
                alive[b] = False
                continue
            histories[b].append({"role": "assistant", "content": text})
            summary.answers += 1
    out = []
    for row, history in zip(rows, histories, strict=True):
        if any(m["role"] == "assistant" for m in history):
            out.append({"id": row["id"], "messages": history})
        else:
            summary.skipped["no answer (prompt too long or empty answer)"] += 1
    return out


def _prompt_tokens(tok, messages: list[dict]) -> int:
    return len(chat_prompts(tok, [messages])[0])


@dataclass
class TokenizerOnly:
    """What `regenerate` needs of a target when another engine (a vLLM server) generates: no weights loaded."""

    tokenizer: object
    verifier_name: str


def tokenizer_only(name_or_path: str | None) -> TokenizerOnly:
    from transformers import AutoTokenizer


    ref = resolve_target(name_or_path)
    return TokenizerOnly(AutoTokenizer.from_pretrained(ref.path), ref.hub_id or ref.path)


def regenerate(target, rows: Sequence[dict], options: RegenerateOptions, *, progress: bool = True, answer=None,
               on_rows=None) -> RegenerateSummary:
    """Write `options.out` (JSONL of {"id", "messages", "regenerated"}) with the target's own answers; resumable.

    `on_rows(rows)` is called with each batch's rows once they are in the file."""
    from tqdm import tqdm

    if any("messages" not in r for r in rows):
        raise WorkbenchError("regenerate needs chat rows (messages), not already-tokenised ones",
                             hint="give a dataset of conversations (messages, conversations or prompt/completion)")

    SamplingParams(temperature=options.temperature, top_p=options.top_p)  # a clear error for bad sampling values
    out, batch_size, seed = Path(options.out), options.batch_size, options.seed
    summary = RegenerateSummary(out=str(out))
    f, done = open_output(out)
    if answer is None:  # generate_answers: which of its two ways
        fused = decodes_fused(target, options.temperature)
        backend = "fused" if fused else "transformers"
    else:
        fused, backend = getattr(answer, "fused", False), getattr(answer, "backend", "vllm")
    # the fused batch refills a row as soon as its answer ends: it gets several batches' conversations per call
    group = batch_size * FUSED_GROUP if fused else batch_size
    log.info("decoding: %s%s", backend,
             f" ({batch_size} rows at a time, {group} conversations per write)" if fused else "")
    meta = {"target": target.verifier_name, "backend": backend,
            "temperature": options.temperature, "max_new_tokens": options.max_new_tokens, "seed": seed}
    rep = reporter()
    try:
        todo = [r for r in rows if str(r["id"]) not in done]
        summary.already_done = len(rows) - len(todo)
        if summary.already_done:
            log.info("resuming: %d of %d conversations already in %s", summary.already_done, len(rows), out)
        start = time.monotonic()
        with tqdm(total=len(todo), unit="conv", desc="regenerate", disable=not progress, dynamic_ncols=True) as bar:
            for k in range(0, len(todo), group):
                torch.manual_seed(seed * 1_000_003 + k)  # a batch samples the same way when re-run
                batch = todo[k: k + group]
                written = regenerate_batch(target, batch, options, summary, answer)
                append_rows(f, [dict(r, regenerated=meta) for r in written])
                if on_rows is not None:
                    on_rows(written)
                summary.written += len(written)
                summary.seconds = time.monotonic() - start
                bar.update(len(batch))
                bar.set_postfix(tok_s=f"{summary.tokens_per_s:.1f}")
                rep.update(f"regenerated {summary.already_done + k + len(batch)}/{len(rows)} conversations "
                           f"({summary.tokens_per_s:.1f} tok/s)", (summary.already_done + k + len(batch)) / len(rows))
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()
    log.info("regenerated %d conversations into %s (%d answers, %.1f tok/s)", summary.written, out, summary.answers,
             summary.tokens_per_s)
    return summary
