"""Baseline and speculative generation of one prompt, interleaved so both answers stream side by side.

Each side is advanced in turn by whichever has used less of its own compute time, so both appear at the pace
they would have alone; tokens/s and the speedup use each side's own time only (display time excluded).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from engine.cpu import load_text, under_load
from engine.generate.events import StepEvent
from engine.generate.explain import SHORT_ANSWER_TOKENS as SHORT_TOKENS  # noqa: F401 (re-exported for pages)
from engine.generate.explain import (
    explain,  # noqa: F401 (re-exported for pages)
    profile,
)
from engine.generate.metrics import SpecMetrics
from engine.generate.options import GenerateOptions
from engine.generate.prompt import prompt_ids as engine_prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate
from engine.jobs import duration_text
from engine.targets.resolve import builtin_for
from ui.cli import command
from ui.proposers import p_min_problem
from ui.tokens import TokenMark, TokenText


@dataclass
class Side:
    """One answer being generated: its events, token marks, own compute time and acceptance metrics."""

    name: str
    text: TokenText
    marks: list[TokenMark] = field(default_factory=list)
    events: list[StepEvent] = field(default_factory=list)
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
    own_s: float = 0.0
    first_s: float | None = None  # own time until the first token (prefill)
    done: bool = False
    finished: str | None = None
    drafted_by: list[str | None] = field(default_factory=list)  # per event: "ngram" / "draft" (draft + n-gram)

    def add(self, event: StepEvent) -> None:
        self.events.append(event)
        self.metrics.observe(event)
        rejected = [self.text.tokenizer.decode([t], skip_special_tokens=False) for t in event.rejected]
        for i, (tok, src) in enumerate(zip(event.tokens, event.sources, strict=True)):
            last = i == len(event.tokens) - 1
            self.marks.append(TokenMark(self.text.add(tok), src, event.step, rejected if last else []))
        if event.finished:
            self.finished = event.finished

    @property
    def ids(self) -> list[int]:
        return self.text.ids

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first one over the time after the prefill (like vLLM's ITL-based rate)."""
        decode_s = self.own_s - (self.first_s or 0.0)
        if len(self.ids) > 1 and decode_s > 0:
            return (len(self.ids) - 1) / decode_s
        return len(self.ids) / self.own_s if self.own_s > 0 else 0.0

    def step_lengths(self) -> list[int]:
        """Tokens emitted per verification step (the acceptance length of that step), prefill excluded."""
        return [len(e.tokens) for e in self.events if e.step > 0]

    def step_rows(self) -> list[dict]:
        """One row per verification step; a block drafter's whole block is one step (`block` marks each slot)."""
        tok = self.text.tokenizer
        cuts = any(e.withheld or e.confidence for e in self.events)
        by = self.drafted_by if any(self.drafted_by) else []
        rows = []
        for i, e in enumerate(self.events):
            row = {"step": e.step, "emitted": tok.decode(e.tokens, skip_special_tokens=False),
                   "sources": " ".join(e.sources), "accepted/drafted": f"{e.accepted}/{e.drafted}",
                   "block": block_marks(e),
                   "rejected drafts": " ".join(repr(tok.decode([t], skip_special_tokens=False)) for t in e.rejected)}
            if cuts:
                row["survival (cut at |)"] = survival_text(e)
            if by:
                row["proposed by"] = SOURCE_WORDS.get(by[i], "") if i < len(by) else ""
            rows.append(row)
        return rows

    def profile(self):
        """The decode steps summed (engine.generate.explain.Profile): tokens, steps, time split, acceptance."""
        return profile(self.events)

    def source_counts(self) -> dict[str, int]:
        """Of a draft + n-gram side, how many steps each proposed: {"ngram": 12, "draft": 30}; {} for the others."""
        counts: dict[str, int] = {}
        for source in self.drafted_by:
            if source:
                counts[source] = counts.get(source, 0) + 1
        return counts

    def summary(self) -> dict:
        return {"tokens": len(self.ids), "seconds": round(self.own_s, 3), "tokens_per_s": self.tokens_per_s,
                "first_token_s": self.first_s,
                "mean_acceptance_length": self.metrics.mean_acceptance_length,
                "per_position_acceptance": self.metrics.per_position_acceptance, "finished": self.finished,
                "proposed_by": self.source_counts()}


class Race:
    """Baseline and every proposer answering one prompt, interleaved, in a worker thread the page polls.

    `sides` holds one Side per entry of `proposers` (None = the target alone); the page draws them while
    `running` and reads `error` afterwards. `cancel()` stops the worker at its next step (page left or rerun).
    """

    def __init__(self, target, prompt_ids: list[int], params: SamplingParams, proposers: dict, k: int):
        tok = target.tokenizer
        self.sides = {name: Side(name, TokenText(tok)) for name in proposers}
        self._proposers = proposers
        self._gens = {name: generate(TargetRunner(target, getattr(p, "aux_layer_ids", None)), prompt_ids, params,
                                     p, k)
                      for name, p in proposers.items()}
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            while not self._cancel.is_set() and not all(s.done for s in self.sides.values()):
                side = min((s for s in self.sides.values() if not s.done), key=lambda s: s.own_s)
                t0 = time.perf_counter()
                try:
                    event = next(self._gens[side.name])
                except StopIteration:
                    side.done = True
                    event = None
                side.own_s += time.perf_counter() - t0
                if event is not None:
                    if side.first_s is None:
                        side.first_s = side.own_s
                    # who proposed this step, where the proposer picks per step (draft + n-gram's last_source)
                    source = getattr(self._proposers[side.name], "last_source", None) if event.step else None
                    side.drafted_by.append(source)
                    side.add(event)
        except BaseException as exc:  # re-raised in the page's thread, where the error guard shows it
            self.error = exc
        finally:
            for side in self.sides.values():
                side.done = True

    def start(self) -> Race:
        self._thread = threading.Thread(target=self.run, name="demo-chat-race", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error

    def cancel(self) -> None:
        self._cancel.set()


SOURCE_WORDS = {"ngram": "n-gram", "draft": "draft"}  # a draft + n-gram step's proposer, in the step table
BLOCK_MARKS = {"accepted": "✓", "rejected": "✗", "after": "·", "withheld": "✂"}
BLOCK_LEGEND = ("block: one mark per drafted slot, ✓ accepted, ✗ the first rejected, · after it (not used), "
                "✂ drafted but cut by the confidence head before verification")


def race_progress(race: Race, titles: dict[str, str], max_new_tokens: int) -> tuple[float, str]:
    """A running turn's progress: (fraction of the tokens asked for, "Baseline 34/96 tokens, 5.1 tokens/s · ... ·
    about 25 s left"); an answer that stops early (end of text) counts as complete."""
    parts, done, left = [], 0.0, 0.0
    for name, side in race.sides.items():
        n = len(side.ids)
        done += 1.0 if side.done else min(1.0, n / max(1, max_new_tokens))
        rate = side.tokens_per_s if n > 1 else 0.0
        parts.append(f"{titles.get(name, name)} {n}/{max_new_tokens} tokens"
                     + (f", {rate:.1f} tokens/s" if rate else "") + (" (done)" if side.done else ""))
        if not side.done and rate:  # the sides take turns on the CPU: their remaining times add up
            left += (max_new_tokens - n) / rate
    fraction = done / max(1, len(race.sides))
    waiting = f"{duration_text(race.elapsed)} so far" + (f" · about {duration_text(left)} left" if left else "")
    return min(1.0, fraction), " · ".join(parts + [waiting])


STEP_COLUMN = "ms, step + verification"  # what `auto` compares: a one-token step plus a (k + 1)-token verification


def kernel_rows(kernel: dict | None) -> list[dict]:
    """The target's kernel paths timed on this CPU, one row each (from `target.extra["kernel"]`), the chosen one
    first; a "measured" column flags timings taken under load."""
    kernel = kernel or {}
    k1 = int(kernel.get("k") or 0) + 1
    load = {"measured": "under load"} if under_load(kernel.get("other_load")) else {}
    rows = [{"path": name + (" (chosen)" if name == kernel.get("path") else ""), "ms per token": f"{c['ms_1']:.1f}",
             f"ms for {k1} tokens": _num(c.get("ms_k1"), ".1f"), STEP_COLUMN: _num(_step_ms(c), ".1f"),
             "row-exact": "yes" if c.get("row_exact") else "no", **load}
            for name, c in (kernel.get("candidates") or {}).items() if c.get("ms_1") is not None]
    return sorted(rows, key=lambda r: not r["path"].endswith("(chosen)"))


def _step_ms(candidate: dict) -> float | None:
    """A timed path's cost as `auto` weighs it: a one-token step plus a (k + 1)-token verification, in ms."""
    return None if candidate.get("ms_k1") is None else candidate["ms_1"] + candidate["ms_k1"]


def kernel_rule(kernel: dict | None) -> str:
    """Why the chosen path is the one decoding uses, in words the table beside it bears out."""
    kernel = kernel or {}
    path, mode = kernel.get("path"), kernel.get("mode") or "auto"
    timed = {n: c for n, c in (kernel.get("candidates") or {}).items() if _step_ms(c) is not None}
    exact = [n for n, c in timed.items() if c.get("row_exact")]
    by = f"by a one-token step plus a {int(kernel.get('k') or 0) + 1}-token verification (*{STEP_COLUMN}*)"
    if kernel.get("source") == "forced":
        return f"`{path}` is forced by --dtype; the timings are those measured at the target's first load."
    if mode == "auto" and exact:
        chosen = _step_ms(timed[path]) if path in timed else None
        faster = [n for n in timed if n not in exact and chosen is not None and _step_ms(timed[n]) < chosen]
        inexact = f"; {', '.join(faster)} ran faster but {'is' if len(faster) == 1 else 'are'} not row-exact"
        return (f"`auto` takes the fastest **row-exact** path {by} (several-row forwards equal to its one-token steps "
                f"bit for bit): `{path}`" + (inexact if faster else "") + ".")
    if mode == "auto":
        return (f"No path is row-exact on this CPU: `auto` takes the fastest of all {by}: `{path}` (lossless in "
                "distribution, not bit-identical).")
    return f"`{mode}` takes the fastest path {by}, row-exact or not: `{path}`."


def kernel_load_note(kernel: dict | None, target: str) -> str | None:
    """A warning when the kernel paths were timed under load (the table and the choice may not hold), with how to
    measure again; None otherwise."""
    from engine.generate.kernel_choice import cache_dir

    share = (kernel or {}).get("other_load")
    if not under_load(share):
        return None
    again = (f"`python -m engine targets --prepare {builtin.name} --measure-kernels`"
             if (builtin := builtin_for(target)) else f"delete its decision under `{cache_dir()}` and load it again")
    return (f"These timings were measured {load_text(share)}: they, and the path chosen from them, may not hold on "
            f"a quiet machine. To measure again on a quiet machine: {again}.")


def kernel_untried(kernel: dict | None) -> str | None:
    """The paths not timed here, one sentence per reason: "Not tried: a, b (why)."."""
    why: dict[str, list[str]] = {}
    for name, c in ((kernel or {}).get("candidates") or {}).items():
        if c.get("ms_1") is None and c.get("skipped"):
            why.setdefault(c["skipped"], []).append(name)
    return " ".join(f"Not tried: {', '.join(names)} ({reason})." for reason, names in why.items()) or None


def explain_table(rows: dict[str, dict]) -> list[dict]:
    """The explanation's figures with one column per proposer and one row per quantity (narrow enough that no
    column is cut)."""
    per = {row["label"]: explain_row(row) for row in rows.values()}
    keys = [k for k in next(iter(per.values()), {}) if k != "proposer"]
    return [{"": key, **{label: values[key] for label, values in per.items()}} for key in keys]


def kernel_source(kernel: dict | None) -> str:
    """How the path was decided, in words: "measured at first load on <cpu>, torch <version>"."""
    kernel = kernel or {}
    why = {"measured": "measured now", "cached": "measured at first load", "forced": "forced by --dtype",
           "gpu": "GPU: fp32"}.get(kernel.get("source"), "timed")
    return f"{why} on {kernel.get('cpu', 'this CPU')}, torch {kernel.get('torch', '?')}"


def kernel_exact(kernel: dict | None) -> bool | None:
    """Whether the target's kernel path gives several-row forwards equal to its one-token steps on this CPU (None:
    not checked), from `target.extra["kernel"]`."""
    kernel = kernel or {}
    value = ((kernel.get("candidates") or {}).get(kernel.get("path")) or {}).get("row_exact")
    return None if value is None else bool(value)


def identical_badge(label: str, identical: bool, exact: bool | None, temperature: float) -> tuple[str, str, str]:
    """(text, colour, help) of the badge that compares one proposer's answer with the baseline's, saying which
    comparison it makes: equal tokens, and whether the kernel path promises that (bit-identical) or not (lossless)."""
    if identical:
        promise = {True: "bit-identical kernel path: equal by construction",
                   False: "lossless kernel path: equal this time, not guaranteed at near-ties",
                   None: "kernel path's exactness not checked"}[exact]
        return (f"Identical output: {label} = baseline ({promise})", "green",
                "The same tokens as the target alone, compared token by token.")
    why = ("Expected with temperature > 0 (the same distribution, different samples)." if temperature > 0 else
           "This kernel path is lossless in distribution, not bit-identical: a verification over several tokens "
           "rounds differently from one-token steps, so at a near-tie the greedy answers can part (as in vLLM); "
           "`--dtype auto` picks an exact path where this CPU has one." if exact is False else
           "Unexpected at temperature 0 on an exact kernel path: please report it.")
    return f"{label}: output differs", "orange", why


def block_marks(event) -> str:
    """'✓✓✗··✂' for a step: which drafted slots the target accepted, rejected, never reached, or never saw."""
    if not event.drafted and not event.withheld:
        return ""
    rejected = event.drafted - event.accepted
    return (BLOCK_MARKS["accepted"] * event.accepted + (BLOCK_MARKS["rejected"] if rejected else "")
            + BLOCK_MARKS["after"] * max(0, rejected - 1) + BLOCK_MARKS["withheld"] * event.withheld)


def survival_text(event) -> str:
    """The proposer's survival estimates of a step, a bar where its cut fell: '0.93 0.71 | 0.14'."""
    values = [f"{v:.2f}" for v in event.confidence]
    if not values:
        return ""
    kept = event.drafted
    return " ".join(values[:kept]) + (" | " + " ".join(values[kept:]) if kept < len(values) else "")


def race(target, prompt_ids: list[int], params: SamplingParams, proposer, k: int) -> tuple[Side, Side]:
    """The baseline and one speculative answer, interleaved, in this thread; returns (baseline, spec)."""
    r = Race(target, prompt_ids, params, {"baseline": None, "speculative": proposer}, k)
    r.run()
    if r.error is not None:
        raise r.error
    return r.sides["baseline"], r.sides["speculative"]


def machine_load() -> tuple[float, int] | None:
    """(1-minute load average, CPU count), or None where the OS has no load average."""
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return None


def busy_note() -> str | None:
    """A sentence when the machine is busy (load above its core count): timings are slower and noisier."""
    load = machine_load()
    if load is None or load[0] < 0.9 * load[1]:
        return None
    return (f"This machine is busy (load {load[0]:.1f} on {load[1]} cores): answers take longer and speeds are "
            "noisier than on an idle machine; compare sides of the same turn, not turns.")


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat-templated token ids of a conversation (engine.generate.prompt.prompt_ids)."""
    return engine_prompt_ids(tokenizer, messages)


def generate_commands(prompt: str, settings: dict, proposers: dict[str, str | dict | None]) -> str:
    """The `generate` commands of a chat turn, one per line: the baseline, then each proposer: its GenerateOptions
    fields (`side_settings`: method, draft, p_min, ngram_min_match), or just its draft folder (None: n-gram);
    `settings` are the turn's GenerateOptions fields (target, k, max_new_tokens, temperature, seed)."""
    base = GenerateOptions(**settings)
    runs = [{"method": "baseline", "draft": None},
            *(p if isinstance(p, dict) else {"method": "ngram" if p is None else "draft", "draft": p}
              for p in proposers.values())]
    return "\n".join(command(base.model_copy(update=_set(run)).argv("generate", prompt)) for run in runs)


def _set(fields: dict) -> dict:
    """The fields a command states: a setting left off (None) is not written."""
    return {name: value for name, value in fields.items() if value is not None or name == "draft"}


SIDE_METHODS = {"draft": "draft", "draft_2": "draft", "draft_ngram": "draft_ngram", "ngram": "ngram"}


def side_settings(chosen: list[str], paths: dict[str, str | None], *, p_min: float | None,
                  min_match: int) -> dict[str, dict]:
    """Each chosen proposer of the chat (`SIDE_METHODS`) as GenerateOptions fields: its method and draft, p_min where
    its draft makes that cut, ngram_min_match for draft + n-gram."""
    out = {}
    for name in chosen:
        method = SIDE_METHODS[name]
        path = paths.get(name) if method != "ngram" else None
        fields: dict = {"method": method, "draft": path}
        if p_min and path and p_min_problem(path) is None:
            fields["p_min"] = p_min
        if method == "draft_ngram":
            fields["ngram_min_match"] = int(min_match)
        out[name] = fields
    return out


def p_min_state(chosen: list[str], paths: dict[str, str | None], labels: dict[str, str]) -> tuple[bool, str | None]:
    """(whether the p-min input applies to the chosen proposers, a sentence of where it is off and why, or None)."""
    drafting = {name: paths.get(name) for name in chosen if SIDE_METHODS[name] != "ngram"}
    if not drafting:
        return False, ("p-min is off: it cuts a draft's chain, and no proposer with a draft is chosen (Draft model, "
                       "Draft + n-gram).")
    problems = {name: p_min_problem(path) for name, path in drafting.items()}
    off = {name: why for name, why in problems.items() if why}
    if not off:
        return True, None
    if len(off) == len(drafting):
        return False, f"p-min is off: {next(iter(off.values()))}."
    return True, "; ".join(f"p-min is off for {labels.get(name, name)}: {why}" for name, why in off.items()) + "."


def side_title(label: str, k: int, fields: dict) -> str:
    """A chat column's title: "Draft + n-gram, k=3, min match 3, p-min 0.30"."""
    return (f"{label}, k={k}" + (f", min match {fields['ngram_min_match']}" if fields.get("ngram_min_match") else "")
            + (f", p-min {fields['p_min']:.2f}" if fields.get("p_min") else ""))


def sampling(tokenizer, *, max_new_tokens: int, temperature: float, seed: int) -> SamplingParams:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, eos_token_ids=eos)


def _num(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None else "–"


def explain_row(row: dict) -> dict:
    """One proposer of a turn as a table row: acceptance, speedup and its ceiling first (visible without scrolling),
    then the step cost and its split."""
    pos = row.get("per_position_acceptance") or []
    return {"proposer": row["label"],
            "mean acceptance length (drafted steps)": _num(row.get("mean_acceptance_length"), ".2f"),
            "tokens per step (all steps)": _num(row.get("tokens_per_step"), ".2f"),
            "speedup": (("≈" if row.get("short") else "") + _num(row.get("speedup"), ".2f") + "×")
            if row.get("speedup") is not None else "–",
            "ceiling (free drafting)": _num(row.get("ceiling"), ".2f") + "×" if row.get("ceiling") else "–",
            "step cost (baseline steps)": _num(row.get("step_cost"), ".2f"),
            "target verification": _num(row.get("target_share"), ".0%"),
            "drafting": _num(row.get("draft_share"), ".0%"),
            "the rest": _num(row.get("rest_share"), ".0%"),
            "per-position acceptance": " · ".join(f"{p:.0%}" for p in pos) or "–"}
