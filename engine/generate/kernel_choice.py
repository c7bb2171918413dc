"""Which exact kernel path decodes a target fastest on this CPU: measured at first load, cached per CPU and torch."""

# A path is a target dtype plus how its decode forwards run (engine.generate.cpu_kernels). At the first load of a
# target on a machine every candidate is timed for one and for k + 1 new tokens after the same prompt, and checked to
# give, for several new rows in one forward, the same logits bit for bit as the one-token steps it replaces (what keeps
# greedy speculation exactly the baseline). `auto` takes the fastest exact path (a one-token step plus a (k + 1)-token
# verification); where no path is exact it takes the fastest one, and so does `fastest` everywhere: such a path is
# lossless in distribution, as vLLM is (a verification over several rows may round differently from the one-token
# steps at near-ties, so greedy output can differ from the baseline's), and every summary says which of the two the
# chosen path is. bf16 paths are candidates only on a CPU with native bf16 (engine.cpu.native_bf16), emulated bf16 is
# never chosen. The decision is cached as a small JSON under the workbench home, keyed by CPU model, flags, torch
# version and target identity, so a changed machine, torch or target measures again. `--dtype fp32|bf16` forces a
# path without measuring. Whether other processes kept the CPUs busy while the paths were timed is recorded with the
# decision (engine.cpu.OtherLoad): a choice made from a loaded measurement says so wherever it is shown.

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.cpu import OtherLoad, cpu_flags, cpu_model, load_text, native_bf16, under_load
from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_json, read_json, workbench_home
from engine.generate.cpu_kernels import (
    PACKED_FORMS,
    force_routing,
    packed_linear_available,
    route_decode_kernels,
    set_attention_form,
    set_linear_form,
)
from engine.generate.fused_decoder import fused_problem, has_fused_weights
from engine.generate.runner import TargetRunner
from engine.jobs import Ticks, reporter
from engine.targets.dtypes import pick_device
from engine.targets.loading import Target, load_target
from engine.targets.resolve import resolve_target

log = logging.getLogger(__name__)

CACHE_FORMAT = 5  # bump when what a decision records (or how it is measured) changes
DEFAULT_K = 3  # drafts per step the verification timing assumes (the workbench's default k)
PROMPT_TOKENS = 64  # KV cache the timed forwards run after
REPEATS = 11  # timed repeats per shape and candidate, after the exactness check warmed it up (median kept)
EXACT_ROWS = (2, 8)  # besides k + 1: row counts whose forward must equal their one-token steps bit for bit
CHOICE_PHASE = "timing the kernel paths on this machine"  # a job's phase while it chooses (learned_seconds)
LOAD_PHASE = "loading the target on the chosen path"


@dataclass(frozen=True)
class KernelPath:
    """A way to run the decode forwards: the target dtype and how its few-row linears and attention run."""

    name: str
    dtype: torch.dtype
    routed: bool  # TargetRunner routes the few-row linears and attention (engine.generate.cpu_kernels)
    native_bf16_only: bool
    description: str
    linear_form: str = "gemm"  # engine.generate.cpu_kernels.LINEAR_FORMS
    attention_form: str = "sdpa-rows"  # engine.generate.cpu_kernels.ATTENTION_FORMS
    force_routing: bool = False  # route an fp32 model too
    fused: bool = False  # decoder layers as one plain forward (engine.generate.fused_decoder), where the model allows

    def prepare(self, model: torch.nn.Module) -> None:
        if not self.routed:
            return
        set_linear_form(model, self.linear_form)
        set_attention_form(model, self.attention_form)
        if self.force_routing:
            force_routing(model)
        route_decode_kernels(model)


_ROWS = "attention row by row"
_MASKED = ("attention over all rows at once as eager products, each row's unseen keys masked (exact only if this "
           "CPU's products ignore the row count and the masked zeros)")
PATHS: dict[str, KernelPath] = {p.name: p for p in (
    KernelPath("fp32", torch.float32, False, False, "fp32 weights, transformers' kernels"),
    KernelPath("fp32-routed", torch.float32, True, False,
               f"fp32 weights, few-row linears as GEMM and {_ROWS} (engine.generate.cpu_kernels)", force_routing=True),
    KernelPath("bf16-routed", torch.bfloat16, True, True,
               f"bf16 weights, few-row linears as weight @ x^T (one row padded to two) and {_ROWS}"),
    KernelPath("bf16-routed-gemv1", torch.bfloat16, True, True,
               "as bf16-routed, but one row through F.linear's GEMV (exact only if this CPU's GEMV rounds like its "
               "GEMM)", linear_form="gemm-gemv1"),
    KernelPath("bf16-routed-linear", torch.bfloat16, True, True,
               f"bf16 weights, few-row linears through F.linear's GEMM (one row padded to two) and {_ROWS} (exact "
               f"only if that GEMM is row-invariant here)", linear_form="linear-pad2"),
    KernelPath("bf16-routed-masked", torch.bfloat16, True, True, f"as bf16-routed, {_MASKED}",
               attention_form="eager-masked"),
    KernelPath("bf16-routed-linear-masked", torch.bfloat16, True, True,
               f"as bf16-routed-linear, {_MASKED}",
               linear_form="linear-pad2", attention_form="eager-masked"),
    KernelPath("bf16-routed-checked-masked", torch.bfloat16, True, True,
               "as bf16-routed-linear-masked, but one row through F.linear's GEMV for the weight shapes whose GEMV "
               "rounds as the GEMM's rows do here (checked per shape at load)",
               linear_form="linear-checked", attention_form="eager-masked"),
    KernelPath("bf16-routed-packed-masked", torch.bfloat16, True, True,
               "as bf16-routed-linear-masked, the weights packed once for oneDNN's linear (F.linear repacks them on "
               "every call; a second copy of the linear weights in memory)",
               linear_form="packed-pad2", attention_form="eager-masked"),
    KernelPath("bf16-fused-packed-masked", torch.bfloat16, True, True,
               "as bf16-routed-packed-masked, the decoder layers as one plain forward: query/key/value and gate/up "
               "linears fused, a preallocated key/value cache, no per-module overhead (Llama, Qwen2, Qwen3 and Mistral "
               "layouts without sliding windows)",
               linear_form="packed-pad2", attention_form="eager-masked", fused=True),
    KernelPath("fp32-fused-packed-masked", torch.float32, True, False,
               "fp32 weights, the decoder layers as one plain forward as bf16-fused-packed-masked, on oneDNN's packed "
               "fp32 linear (one row padded to two)",
               linear_form="packed-pad2", attention_form="eager-masked", force_routing=True, fused=True),
    KernelPath("bf16-plain", torch.bfloat16, False, True,
               "bf16 weights, transformers' kernels (fused multi-row attention, GEMV for one row)"),
)}
FORCED = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16-routed", "bfloat16": "bf16-routed"}
MEASURED_MODES = ("auto", "fastest")  # choices decided by measurement (the rest force a path)
CHOICES = (*MEASURED_MODES, "fp32", "bf16", "float32", "bfloat16")
EXACT_LABEL = "bit-identical: speculative output equals the baseline's"
LOSSLESS_LABEL = ("lossless in distribution, not bit-identical: verifying several tokens in one forward rounds "
                  "differently from one-token steps, so at near-ties the output can differ from the baseline's (as in "
                  "vLLM)")


@dataclass
class Choice:
    """The path decoding uses, how it was decided, and the measurements behind it (ms; None where not timed)."""

    path: str
    source: str  # measured | cached | forced | gpu
    k: int
    cpu: str
    torch: str
    native_bf16: bool
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    mode: str = "auto"  # auto | fastest | forced (what asked for this path)
    other_load: float | None = None  # share of the CPUs other processes used while the paths were timed (None: unknown)

    @property
    def loaded(self) -> bool:
        """The paths were timed while other processes kept the CPUs busy: the timings, and the choice, may not hold."""
        return under_load(self.other_load)

    @property
    def dtype(self) -> torch.dtype:
        return PATHS[self.path].dtype

    @property
    def routed(self) -> bool:
        return PATHS[self.path].routed

    @property
    def row_exact(self) -> bool | None:
        """Whether the chosen path's multi-row forwards equal its one-token steps here (None: not checked)."""
        value = self.candidates.get(self.path, {}).get("row_exact")
        return None if value is None else bool(value)

    def exactness(self) -> str:
        """What speculative output on this path promises against the baseline, in words."""
        if self.row_exact is None:
            return "row exactness not checked here"
        return EXACT_LABEL if self.row_exact else LOSSLESS_LABEL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line: the path, why, and the timings that decided it."""
        why = {"measured": "measured now", "cached": "measured at first load", "forced": "forced by --dtype",
               "gpu": "GPU: fp32 (its fused bf16 kernels are not row-invariant)"}[self.source]
        parts = []
        for name, c in self.candidates.items():
            if c.get("skipped"):
                parts.append(f"{name} not tried ({c['skipped']})")
            elif c.get("ms_1") is not None:
                exact = "exact" if c.get("row_exact") else "NOT row-exact"
                parts.append(f"{name} {c['ms_1']:.1f} ms/token, {c['ms_k1']:.1f} ms for {self.k + 1} tokens, {exact}")
        detail = f": {'; '.join(parts)}" if parts else ""
        load = f"; measured {load_text(self.other_load)}" if self.loaded else ""
        return f"{self.path} ({why} on {self.cpu}, torch {self.torch}; {self.exactness()}{load}){detail}"


def cache_dir() -> Path:
    return workbench_home() / "kernels"


def target_identity(name_or_path: str | None) -> dict[str, Any]:
    """What names a target's weights here: its folder and the size and mtime of its config and weight files."""
    ref = resolve_target(name_or_path)
    folder = Path(ref.path)
    files = sorted(p for p in folder.glob("*") if p.suffix in (".json", ".safetensors", ".bin")) if folder.is_dir() \
        else []
    return {"target": ref.name, "path": ref.path,
            "files": [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files]}


def cache_key(name_or_path: str | None, k: int) -> dict[str, Any]:
    """Everything a decision depends on: format, CPU model and flags, torch version, target identity, k."""
    flags = ",".join(sorted(cpu_flags()))
    return {"format": CACHE_FORMAT, "cpu": cpu_model(), "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "torch": torch.__version__, "threads": torch.get_num_threads(), "k": k, **target_identity(name_or_path)}


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"{digest}.json"


def read_cached(name_or_path: str | None, k: int = DEFAULT_K) -> Choice | None:
    """The cached decision for this target on this CPU and torch (None when there is none or it is unreadable)."""
    key = cache_key(name_or_path, k)
    try:
        record = read_json(cache_path(key))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or record.get("choice", {}).get("path") not in PATHS:
        return None
    choice = Choice(**{**record["choice"], "mode": "auto"})
    choice.source = "cached"
    return choice


# ---------------------------------------------------------------------------------------------------
# Measuring one candidate
# ---------------------------------------------------------------------------------------------------


def _forward_ms(runner, prompt_len: int, new: list[int]) -> float:
    runner.crop(prompt_len)
    t = time.perf_counter()
    runner.forward(new)
    return 1e3 * (time.perf_counter() - t)


def rows_equal_steps(runner, prompt_len: int, new: list[int]) -> bool:
    """One forward over `new` gives the logits of len(new) one-token forwards, bit for bit."""
    runner.crop(prompt_len)
    block, _ = runner.forward(new)
    runner.crop(prompt_len)
    steps = torch.cat([runner.forward([t])[0] for t in new])
    runner.crop(prompt_len)
    return bool(torch.equal(block, steps))


def _prompt(vocab: int) -> list[int]:
    return [100 + (i * 37) % max(1, vocab - 100) for i in range(PROMPT_TOKENS)]


def measure_units(paths: list[str], repeats: int = REPEATS) -> int:
    """The size of a kernel choice, which its time scales with: each path loaded and checked, then timed."""
    return len(paths) * (1 + repeats)


def measure(name_or_path: str | None, k: int, paths: list[str], *, device: str | None = None,
            repeats: int = REPEATS, tick: Any = None) -> dict[str, dict[str, Any]]:
    """For each path: median ms of a 1-token and a (k + 1)-token forward, and whether several rows equal steps;
    `tick()` after each path's load and each timing (its progress, measure_units in all)."""
    tick = tick or (lambda: None)
    # Where every candidate's copy of the target fits in INTERLEAVE_MEMORY_SHARE of the free memory, all are loaded and
    # their repeats interleaved round-robin: separate loads of the same weights ran a step at clearly different speeds
    # on a shared VM (the AMD EPYC; not kept as a record), which would decide between paths a few percent apart by
    # chance. Otherwise one path's model at a time (a large target is never held twice). Each is warmed up before it
    # is timed.
    loaded: dict[str, _Candidate] = {}
    results: dict[str, dict[str, Any]] = {}
    interleave = None
    for name in paths:
        try:
            candidate = _Candidate.load(name_or_path, PATHS[name], k, device)
        except _Skipped as e:
            results[name] = {"skipped": str(e), "description": PATHS[name].description}
            for _ in range(1 + repeats):  # nothing of it to time
                tick()
            continue
        tick()
        if interleave is None:
            interleave = _fits_together(candidate.runner.model, [PATHS[n] for n in paths])
        if interleave:
            loaded[name] = candidate
        else:
            results[name] = candidate.timed(repeats, tick)
            del candidate
    for _ in range(repeats):
        for candidate in loaded.values():
            candidate.time_once()
            tick()
    results.update({name: c.result() for name, c in loaded.items()})
    return {name: results[name] if "skipped" in results[name] else {**results[name], "interleaved": bool(interleave)}
            for name in paths}


INTERLEAVE_MEMORY_SHARE = 0.3  # of MemAvailable: the most all candidates' copies may take to be timed together


def _fits_together(model: torch.nn.Module, paths: list[KernelPath]) -> bool:
    """All candidates' copies of this model fit in INTERLEAVE_MEMORY_SHARE of the available memory."""
    numel = sum(p.numel() for p in model.parameters())
    copies = [2 if _copies_weights(p) else 1 for p in paths]
    need = sum(c * numel * torch.empty(0, dtype=p.dtype).element_size() for p, c in zip(paths, copies, strict=True))
    free = _free_memory()
    return free is not None and need <= INTERLEAVE_MEMORY_SHARE * free


SECOND_COPY_MEMORY_SHARE = 0.5  # of MemAvailable: the most a path's second copy of the weights may take


def _copies_weights(path: KernelPath) -> bool:
    """The path keeps a second copy of the linear weights (oneDNN's packed layout, or the fused decoder's)."""
    return path.linear_form in PACKED_FORMS or path.fused


def _free_memory() -> int | None:
    """Free physical memory in bytes (the page cache not counted), None where it cannot be read."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def second_copy_problem(model: torch.nn.Module) -> str | None:
    """Why a second copy of the model's weights should not be made here, or None."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    free = _free_memory()
    if free is not None and size > SECOND_COPY_MEMORY_SHARE * free:
        return (f"a second copy of the weights ({size / 1e9:.1f} GB) would take more than "
                f"{SECOND_COPY_MEMORY_SHARE:.0%} of the free memory ({free / 1e9:.1f} GB)")
    return None


def fused_batch_problem(model: torch.nn.Module) -> str | None:
    """Why greedy batches cannot decode on the fused decoder here (`fused_decoder.greedy_batch`), or None; the
    memory check only before its weights are copied (afterwards the copy itself takes the free memory)."""
    return fused_problem(model) or (None if has_fused_weights(model) else second_copy_problem(model))


class _Skipped(Exception):
    """A path not tried for this target: its layers' layout, or no room for a second copy of its weights."""


@dataclass
class _Candidate:
    """One kernel path's loaded target, prefilled, its exactness checked, and its timings so far."""

    path: KernelPath
    runner: Any
    prompt_len: int
    vocab: int
    k: int
    row_exact: bool = False
    one: list[float] = field(default_factory=list)
    several: list[float] = field(default_factory=list)

    @classmethod
    def load(cls, name_or_path: str | None, path: KernelPath, k: int, device: str | None) -> _Candidate:
        target = load_target(name_or_path, dtype=path.dtype, device=device, with_tokenizer=False)
        problem = fused_problem(target.model) if path.fused else None
        if problem:
            raise _Skipped(f"not this target's layout: {problem}")
        problem = second_copy_problem(target.model) if _copies_weights(path) else None
        if problem:
            raise _Skipped(problem)
        path.prepare(target.model)
        runner = TargetRunner(target, route_kernels=path.routed, fused=path.fused)
        prompt = _prompt(target.vocab_size)
        runner.reset()
        runner.forward(prompt, all_logits=False)
        c = cls(path, runner, len(prompt), target.vocab_size, k)
        c.row_exact = all(rows_equal_steps(runner, c.prompt_len, c.new(n)) for n in sorted({k + 1, *EXACT_ROWS}))
        return c

    def new(self, n: int) -> list[int]:
        return [(self.vocab // 2 + 7 * j) % self.vocab for j in range(n)]

    def time_once(self) -> None:
        self.one.append(_forward_ms(self.runner, self.prompt_len, self.new(1)))
        self.several.append(_forward_ms(self.runner, self.prompt_len, self.new(self.k + 1)))

    def timed(self, repeats: int, tick: Any) -> dict[str, Any]:
        for _ in range(repeats):
            self.time_once()
            tick()
        return self.result()

    def result(self) -> dict[str, Any]:
        return {"row_exact": self.row_exact, "ms_1": statistics.median(self.one),
                "ms_k1": statistics.median(self.several), "description": self.path.description}


def pick(candidates: dict[str, dict[str, Any]], mode: str = "auto") -> str:
    """`auto`: the fastest row-exact candidate (one-token step + verification), or the fastest of all when none is
    exact; `fastest`: the fastest of all. fp32 when nothing was timed."""
    timed = {n: c for n, c in candidates.items() if c.get("ms_1") is not None}
    exact = {n: c for n, c in timed.items() if c.get("row_exact")}
    pool = exact if mode == "auto" and exact else timed
    if not pool:
        return "fp32"
    if mode == "auto" and not exact:
        log.warning("no kernel path gave row-exact forwards on this CPU; decoding on the fastest one (lossless in "
                    "distribution, not bit-identical)")
    return min(pool, key=lambda n: pool[n]["ms_1"] + pool[n]["ms_k1"])


def candidate_paths(native: bool) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Paths to measure here, and the skipped ones with why."""
    tried, skipped = [], {}
    for name, path in PATHS.items():
        if path.native_bf16_only and not native:
            skipped[name] = {"skipped": "no native bf16 (AVX-512 BF16 / AMX / Arm BF16): emulated, never chosen",
                             "description": path.description}
        elif path.linear_form in PACKED_FORMS and not packed_linear_available(path.dtype):
            skipped[name] = {"skipped": "oneDNN's packed linear is not available for this dtype here",
                             "description": path.description}
        else:
            tried.append(name)
    return tried, skipped


# ---------------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------------


def _phase_ticks(paths: list[str], span: tuple[float, float] | None) -> Ticks:
    """A job phase for the kernel choice, its progress counted by the returned ticks (`span`: its share of the
    bar; None leaves the bar where it is)."""
    reporter().phase(CHOICE_PHASE, measure_units(paths), span=span)
    return Ticks(measure_units(paths))


def choose(name_or_path: str | None = None, choice: str | torch.dtype = "auto", *, device: str | None = None,
           k: int = DEFAULT_K, refresh: bool = False, span: tuple[float, float] | None = None) -> Choice:
    """The kernel path for decoding this target here: forced by `choice`, else the cached or a new measurement (a
    job phase of its own, within `span` of the bar)."""
    native = native_bf16()
    base = {"k": k, "cpu": cpu_model(), "torch": torch.__version__, "native_bf16": native}
    if isinstance(choice, torch.dtype):
        choice = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(choice, str(choice))
    if choice not in MEASURED_MODES:
        if choice not in FORCED:
            raise WorkbenchError(f"unknown decode dtype '{choice}'", hint=f"use one of {', '.join(CHOICES)}")
        cached = read_cached(name_or_path, k) if pick_device(device) == "cpu" else None
        return Choice(path=FORCED[choice], source="forced", mode="forced", candidates=cached.candidates if cached
                      else {}, other_load=cached.other_load if cached else None, **base)  # as measured here, if it was
    if pick_device(device) != "cpu":
        return Choice(path="fp32", source="gpu", mode=choice, **base)
    if not refresh:
        cached = read_cached(name_or_path, k)
        if cached is not None:
            cached.path, cached.mode = pick(cached.candidates, choice), choice
            return cached
    tried, skipped = candidate_paths(native)
    started, load = time.perf_counter(), OtherLoad()
    measured = measure(name_or_path, k, tried, device="cpu", tick=_phase_ticks(tried, span))
    reporter().phase(LOAD_PHASE)  # what follows is loading, not choosing
    share = load.share()
    result = Choice(path=pick(measured, choice), source="measured", candidates={**measured, **skipped}, mode=choice,
                    other_load=None if share is None else round(share, 3), **base)
    log.log(logging.WARNING if result.loaded else logging.INFO, "kernel choice in %.1f s: %s",
            time.perf_counter() - started, result.summary())
    key = cache_key(name_or_path, k)
    atomic_write_json(cache_path(key), {"key": key, "choice": result.to_dict(),
                                        "measure_s": round(time.perf_counter() - started, 2)})
    return result


def load_decode_target(name_or_path: str | None = None, choice: str | torch.dtype = "auto", *,
                       device: str | None = None, k: int = DEFAULT_K, with_tokenizer: bool = True,
                       span: tuple[float, float] | None = None) -> Target:
    """Load a target for in-process decoding on the chosen path; `target.extra["kernel"]` records the choice (a
    measured one's progress within `span` of the job's bar)."""
    decided = choose(name_or_path, choice, device=device, k=k, span=span)
    target = load_target(name_or_path, dtype=decided.dtype, device=device, with_tokenizer=with_tokenizer)
    path = PATHS[decided.path]
    if target.device.type == "cpu":
        path.prepare(target.model)
    target.extra.update(kernel=decided.to_dict(), kernel_summary=decided.summary(),
                        route_kernels=path.routed and target.device.type == "cpu",
                        fused_decoder=path.fused and target.device.type == "cpu")
    return target
