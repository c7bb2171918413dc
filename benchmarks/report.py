"""BENCHMARKS.md's tables, one per question, generated from the committed records under benchmarks/results/.

    python benchmarks/report.py --write    # rewrite every block between <!-- table:NAME --> and <!-- /table:NAME -->
    python benchmarks/report.py --check    # exit 1 where a block differs from what the records give
"""

# Each table function reads its records and returns the block's lines: the table, then one "how measured" line per
# record (its path, CPU and kind, dtype, day and command). Nothing here holds a result: figures come from the JSON.
# Where several records answer the same question, a table takes the newest on each CPU kind (`newest`); the paths
# below only say where to look. The shapes each table expects are the small helpers under "Record shapes": a record
# without a field a table reads stops the generator with the record's path and the field (RecordError).

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- table:{} -->", "<!-- /table:{} -->"

# Where each question's records are (globs under benchmarks/results/); `newest` picks among them per CPU kind.
SHIPPED_INPROCESS = "dflash2-recipe/*/drafters.json"  # the shipped drafts in one in-process run, n-gram beside them
SHIPPED_VLLM = {"eagle3": "reship-eagle3/*/vllm_bench.json", "dflash": "reship-dflash/*/vllm_bench.json"}
SWEEPS = {"eagle3": "reship-eagle3/*/sweep.json", "dflash": "reship-dflash/*/sweep.json",
          "dflash2": "dflash2-recipe/*/sweep.json"}
ENGINES = ["llamacpp/engines-amd-epyc-avx512bf16.json", "llamacpp/engines-dspark-amd-epyc-avx512bf16.json"]
LLAMACPP_WORKLOAD = "sharegpt"  # the shipped-drafts table's llama.cpp rows: the held-out chat prompts
ATTRIBUTION = "attribution/*.json"
BASELINE = ["baseline_generate/*.json", "decode_speed/*/baseline_generate*.json"]
VLLM_BASELINE = "decode_speed/*/vllm_bench*.json"
LLAMACPP_BASELINE = "llamacpp/*-target-*-draft-*.json"
# Training against speculators 0.9.0: oldest first. Several share a day, so their order is the one they were made in
# (each re-run after a change to our trainers); tests/test_benchmark_report.py checks every such record is listed.
TRAIN_QUALITY = ["train_quality/amd-epyc-zen4.json", "train_quality/amd-epyc-zen4-dspark-batched-heads.json",
                 "train_quality/amd-epyc-zen4-dspark-same-objective.json",
                 "train_quality/amd-epyc-zen4-per-document.json", "train_quality/amd-epyc-zen4-per-document-split.json",
                 "train_quality/amd-epyc-avx2-dflash2-before-fix.json", "train_quality/amd-epyc-avx2-dflash2.json",
                 "train_quality/amd-epyc-zen4-dflash2-before-fused-kl.json",
                 "train_quality/amd-epyc-zen4-dflash2-before-drafted-slots.json",
                 "train_quality/amd-epyc-zen4-dflash2.json"]
PAIRED_TAU = "train_quality/*-paired-100.json"  # the same two drafts on more held-out prompts, sample by sample
DATA_COST = ["data_cost/intel-xeon-amx.json", "data_cost/amd-epyc-zen4-onepass-refill.json",
             "data_cost/amd-epyc-zen4-vllm-onepass-32.json"]
GPU = "gpu_check/*.json"
LEVERS = "levers/*.json"  # benchmarks/bench_levers.py: each proposer lever beside the shipped EAGLE-3 draft
LEVERS_LLAMACPP = "levers-llamacpp/*.json"  # `bench --backend llama.cpp` at each --p-min, same prompts


class RecordError(ValueError):
    """A record lacks what a table reads, or the records leave a choice the generator will not guess."""


# ---------------------------------------------------------------------------------------------------- records


class Fields(dict):
    """A record's object: a field it lacks raises a RecordError naming the record and the field (`.get` as usual)."""

    def __init__(self, items: dict[str, Any], where: str, field: str) -> None:
        super().__init__(items)
        self.where, self.field = where, field

    def __missing__(self, key: str) -> Any:
        raise RecordError(f"{self.where}: no field {self.field + '.' if self.field else ''}{key}")


def _fields(value: Any, where: str, field: str = "") -> Any:
    if isinstance(value, dict):
        return Fields({k: _fields(v, where, f"{field}.{k}" if field else k) for k, v in value.items()}, where, field)
    if isinstance(value, list):
        return [_fields(v, where, f"{field}[{i}]") for i, v in enumerate(value)]
    return value


@cache
def load(path: str) -> dict[str, Any]:
    """The record at `path` (relative to benchmarks/results/), its objects `Fields`."""
    file = RESULTS / path
    if not file.is_file():
        raise RecordError(f"benchmarks/results/{path}: no such record")
    return _fields(json.loads(file.read_text()), f"benchmarks/results/{path}")


def need(path: str, *keys: str | int) -> Any:
    """The record's field at `keys` (nested), or a RecordError naming the record and the field."""
    value: Any = load(path)
    for i, key in enumerate(keys):
        try:
            value = value[key]  # a missing object field raises the RecordError of `Fields`
        except (IndexError, TypeError):
            raise RecordError(f"benchmarks/results/{path}: no field {'.'.join(map(str, keys[:i + 1]))}") from None
    return value


def found(*patterns: str) -> list[str]:
    """The records matching the globs, relative to benchmarks/results/."""
    return sorted({str(p.relative_to(RESULTS)) for pat in patterns for p in RESULTS.glob(pat) if p.is_file()})


def day(path: str) -> str:
    """The record's day; a record filled in after the fact gives the day it last changed, as an upper bound."""
    date = str(need(path, "date"))
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        return date
    days = re.findall(r"\d{4}-\d{2}-\d{2}", date)
    return f"≤ {days[-1]} (day not recorded)" if days else "day not recorded"


def kind(path: str) -> str:
    value = str(need(path, "cpu_kind"))
    return "kind not recorded" if value.startswith("unknown") else value


def newest(paths: Iterable[str], *, ties: bool = False) -> list[str]:
    """Per CPU kind, the newest record (all of that day's with `ties`); two newest on one day otherwise refuse."""
    def when(p: str) -> tuple[str, int]:
        d = day(p)
        return (d, 1) if not d.startswith("≤") else (d[2:12], 0)  # a bound sorts before a day it names
    chosen = []
    for k in sorted({kind(p) for p in paths}):
        mine = [p for p in paths if kind(p) == k]
        top = max(when(p) for p in mine)
        best = [p for p in mine if when(p) == top]
        if len(best) > 1 and not ties:
            raise RecordError(f"two newest records on {k}, both {top[0]}: {best}; name one in benchmarks/report.py")
        chosen += best
    return chosen


def how_measured(paths: Iterable[str]) -> list[str]:
    """One line per record: where it is, the CPU and its kind, the dtype, the day and the command."""
    lines = []
    for path in dict.fromkeys(paths):
        cpu, k = str(need(path, "cpu")), kind(path)
        dtype = load(path).get("dtypes") or need(path, "dtype")
        dtype = ", ".join(dtype) if isinstance(dtype, list) else str(dtype)
        where = cpu if k in cpu else f"{cpu}, {k}"
        lines.append(f"- `{path}`: {where}; {dtype}; {day(path)}; `{need(path, 'command')}`")
    return lines


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def tau(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def times(x: float | None, ci: list[float] | None = None) -> str:
    return "–" if x is None else f"{x:.2f}×" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "")


def yes(x: bool | None) -> str:
    return "–" if x is None else ("yes" if x else "no")


def signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def path_name(kernel: str) -> str:
    """A kernel path as a record describes it ("bf16-fused-packed-masked (measured at first load ...)"): its name."""
    return kernel.split(" (", 1)[0]


# ---------------------------------------------------------------------------------------------- record shapes


def bench_methods(path: str) -> dict[str, dict[str, Any]]:
    """`python -m engine bench` (in-process, vLLM or llama.cpp): per method, its figures against the baseline."""
    return need(path, "methods")


def drafters_run(path: str) -> dict[str, Any]:
    """`bench_drafters.py`: the in-process part (its kernel path per dtype and its methods)."""
    return need(path, "inprocess")


def engines_rows(path: str) -> list[dict[str, Any]]:
    """`bench_engines.py`: one row per (draft, workload), each engine's τ, speedup and forecast."""
    return need(path, "rows")


def sweep_rows(path: str) -> list[dict[str, Any]]:
    """A k sweep (`recipe --only sweep`): one row per k, with its spread where it ran in rounds."""
    return need(path, "rows")


def sweep_size(path: str, row: dict[str, Any]) -> str:
    """A sweep row's prompts × new tokens (each row names them; older sweeps name them once, at the top)."""
    def get(key: str) -> Any:
        return row[key] if key in row else need(path, key)
    return f"{get('num_prompts')} × {get('max_new_tokens')}"


def forecast_beside(path: str) -> tuple[dict[str, Any], str]:
    """The evaluator's forecast per k for a sweep's draft: `evaluate --forecast`'s evaluate.json in the sweep's folder,
    on the same weights ({} where there is none)."""
    evaluated = str(Path(path).parent / "evaluate.json")
    if not (RESULTS / evaluated).is_file() or "forecast" not in load(evaluated):
        return {}, evaluated
    if load(evaluated).get("weights") != load(path).get("weights"):
        raise RecordError(f"benchmarks/results/{evaluated}: another draft's weights than {path}'s")
    return need(evaluated, "forecast", "by_k"), evaluated


def paired_algorithm(path: str) -> str:
    """`bench_paired_tau.py`: the algorithm of the two drafts compared (their run folders are named after it)."""
    return Path(need(path, "ours", "draft")).parent.parent.name


def baseline_speeds(path: str) -> list[tuple[str, str, float]]:
    """`bench_baseline_generate.py`: (decoder, kernel path or dtype, tokens/s) per side, the engine's `auto` first."""
    rows = []
    for key, speed in need(path, "tokens_per_s").items():
        engine = re.fullmatch(r"engine baseline \((\w+): (.+)\)", key)
        hf = re.fullmatch(r"transformers generate \((\w+)\)", key)
        if not (engine or hf):
            raise RecordError(f"benchmarks/results/{path}: tokens_per_s names an unknown side {key!r}")
        rows.append(("engine, " + ("auto" if engine[1] == "auto" else f"--dtype {engine[1]}"), engine[2], speed)
                    if engine else ("transformers generate", hf[1], speed))
    return sorted(rows, key=lambda r: r[0] != "engine, auto")


def train_sides(path: str, algo: str) -> dict[str, dict[str, Any]]:
    """`bench_train_quality.py`: one algorithm's runs ("ours", "speculators", "ours-bf16"), each its speed and τ."""
    return need(path, "results", algo)


def train_tau(side: dict[str, Any]) -> tuple[float | None, bool]:
    """τ at k = 3 of one training run; where decoding verifies no draft, τ with every draft verified (and True)."""
    t = side["eval"]["tau"]["3"]
    return (t, False) if t is not None else (side.get("eval_all_drafts", side["eval"])["tau"]["3"], True)


def data_ways(path: str) -> list[tuple[str, float | None, float | None, float]]:
    """Data cost per conversation, (way, regenerate s, extract s, total s): `bench_onepass.py` or
    `bench_data_cost.py` records."""
    per = need(path, "per_conversation_s")
    if "recipe" in per:  # bench_data_cost.py: each way's regeneration, extraction and total
        names = {"recipe": f"vLLM server ({need(path, 'recipe_batch')} in flight), then transformers extract",
                 "vllm": f"vLLM server ({need(path, 'wide')} in flight), then vLLM extract",
                 "onepass": f"one pass in process ({need(path, 'onepass_batch')} at a time, fused batch)"}
        return [(names[w], None if w == "onepass" else p["regenerate"], None if w == "onepass" else p["extract"],
                 p["total"]) for w, p in per.items()]
    fused = load(path).get("one_pass_backend") == "fused-onepass"
    names = {"two_steps": "regenerate (transformers), then extract",
             "two_steps_fused": "regenerate (fused batch), then extract",
             "one_pass": "one pass" + (", fused batch" if fused else " (regenerate --extract-to)"),
             "one_pass_transformers": "one pass, transformers decoding"}
    ways = []
    for w, total in per.items():
        parts = load(path).get(f"{w}_parts_per_conversation_s") or {}
        ways.append((names[w], parts.get("regenerate"), parts.get("extract"), total))
    return ways


# ------------------------------------------------------------------------------------------------------ tables


def _draft(name: str) -> str:
    """A draft folder as a table names it: its algorithm (the shipped folder's suffix, or a recipe run's)."""
    path = Path(name)
    folder = path.parent.parent.name if path.name == "draft" else path.name
    return folder.rsplit("-", 1)[-1]


def shipped_drafts() -> list[str]:
    """What each shipped draft buys per engine: τ, speedup and n-gram's speedup in the same run."""
    rows, used = [], []
    for path in newest(found(SHIPPED_INPROCESS)):
        run = drafters_run(path)
        methods, paths = run["methods"], run["kernel_paths"]
        for name, m in methods.items():
            if name in ("baseline", "ngram"):
                continue
            rows.append(["in-process", name, m["k"], tau(m["mean_acceptance_length"]), times(m["speedup"]),
                         times(methods["ngram"]["speedup"]), yes(m["identical_to_baseline"]), kind(path),
                         path_name(paths[m["dtype"]]), f"`{path}`"])
        used.append(path)
    for name, pattern in SHIPPED_VLLM.items():
        for path in newest(found(pattern)):
            m = bench_methods(path)
            rows.append(["vLLM CPU build", name, need(path, "k"),
                         tau(m["draft"]["mean_acceptance_length"]), times(m["draft"]["speedup"]),
                         times(m["ngram"]["speedup"]), yes(m["draft"]["identical_to_baseline"]), kind(path),
                         need(path, "dtype"), f"`{path}`"])
            used.append(path)
    path = ENGINES[0]
    for r in engines_rows(path):
        if r["workload"] != LLAMACPP_WORKLOAD:
            continue
        lc = r["llama_cpp"]
        rows.append(["llama.cpp", _draft(r["draft"]), r["k"], tau(lc["tau"]),
                     times(lc["speedup"], lc["ci95"]), times(lc["ngram"]["speedup"], lc["ngram"]["ci95"]),
                     yes(lc["identical"]), kind(path), f"GGUF {lc['calibration']['gguf_target']}", f"`{path}`"])
        used.append(path)
    return table(["engine", "draft", "k", "τ", "speedup", "n-gram, same run", "answers = baseline's", "CPU kind",
                  "target path or dtype", "record"], rows) + [""] + how_measured(used)


def best_k() -> list[str]:
    """Per shipped draft, the speedup at each k (the best in bold), with τ and the step cost in the same run."""
    rows, used = [], []
    for name, pattern in SWEEPS.items():
        for path in newest(found(pattern)):
            forecast, evaluated = forecast_beside(path)
            sweep = sweep_rows(path)
            best = times(max(r["speedup"] for r in sweep))  # every k as fast as the best, as shown, is bold
            ngram = (load(path).get("methods") or {}).get("ngram")
            for r in [*sweep, *([ngram] if ngram else [])]:
                speed = times(r["speedup"], (r.get("spread") or {}).get("ci95"))
                draft = r is not ngram
                rows.append([name if draft else f"n-gram (beside {name})", r["k"], tau(r["mean_acceptance_length"]),
                             f"**{speed}**" if draft and times(r["speedup"]) == best else speed,
                             f"{r['step_cost']:.2f}" if r.get("step_cost") else "–",
                             times(forecast[str(r["k"])]["speedup"]) if draft and str(r["k"]) in forecast else "–",
                             yes(r["identical_to_baseline"]), kind(path), sweep_size(path, r), f"`{path}`"])
            used += [path] + ([evaluated] if forecast else [])
    return table(["draft", "k", "τ", "speedup", "step cost (baseline steps)", "forecast (evaluator)",
                  "answers = baseline's", "CPU kind", "prompts × new tokens", "record"], rows) + [""] + \
        how_measured(used)


def engines() -> list[str]:
    """Every engine's τ against the evaluator's, and each engine's forecast against its measured speedup."""
    from engine.recipes.model_card import engines_table

    return engines_table([r for path in ENGINES for r in engines_rows(path)], with_draft=True) + [""] + \
        how_measured(ENGINES)


def tau_protocols() -> list[str]:
    """One draft's τ under one protocol, then with one factor changed at a time."""
    rows, used = [], []
    for path in newest(found(ATTRIBUTION)):
        for r in need(path, "rows"):
            ci = f" ({r['ci95'][0]:.2f}–{r['ci95'][1]:.2f})" if r.get("ci95") else ""
            rows.append([r["factor"], r["change"], f"{r['tau']:.3f}{ci}",
                         "–" if r["delta"] is None else signed(r["delta"], 2), kind(path), f"`{path}`"])
        used.append(path)
    return table(["factor", "protocol", "τ at k = 3", "change", "CPU kind", "record"], rows) + [""] + \
        how_measured(used)


def baseline() -> list[str]:
    """Tokens per second without a draft, per CPU kind and decoder (kernel path where the engine decodes)."""
    rows, used = [], []
    for path in newest(found(*BASELINE)):
        speeds = baseline_speeds(path)
        auto = speeds[0][2]
        size = f"{need(path, 'prompts')} × {need(path, 'max_new_tokens')}"
        for decoder, way, speed in speeds:
            rows.append([kind(path), decoder, way, f"{speed:.1f}", times(speed / auto), size, f"`{path}`"])
        used.append(path)
    for path in newest(found(VLLM_BASELINE), ties=True):
        rows.append([kind(path), f"vLLM CPU build {need(path, 'vllm_version')}", need(path, "dtype"),
                     f"{bench_methods(path)['baseline']['tokens_per_s']:.1f}", "–",
                     f"{need(path, 'prompts')} × {need(path, 'max_new_tokens')}", f"`{path}`"])
        used.append(path)
    for path in newest(found(LLAMACPP_BASELINE), ties=True):
        target = need(path, "gguf_target")
        rows.append([kind(path), f"llama.cpp {need(path, 'llama_cpp_version')}",
                     f"GGUF {target}" + (f" ({need(path, 'target_gguf')})" if target == "shipped" else ""),
                     f"{bench_methods(path)['baseline']['tokens_per_s']:.1f}", "–",
                     f"{need(path, 'num_prompts')} × {need(path, 'max_new_tokens')}", f"`{path}`"])
        used.append(path)
    rows.sort(key=lambda r: r[0])
    return table(["CPU kind", "decoder", "kernel path or dtype", "tokens/s", "× engine's auto, same run",
                  "prompts × new tokens", "record"], rows) + [""] + how_measured(used)


def _training() -> list[tuple[str, str, str, str]]:
    """(algorithm, CPU kind, side, record): per algorithm, kind and side, the newest record that trained it."""
    latest: dict[tuple[str, str, str], str] = {}
    for path in TRAIN_QUALITY:
        for algo in need(path, "results"):
            for side in train_sides(path, algo):
                if side in ("ours", "ours-bf16"):
                    latest[(algo, kind(path), side)] = path
    return [(a, k, s, p) for (a, k, s), p in latest.items()]


def train_speed() -> list[str]:
    """Tokens per CPU-second, ours against speculators 0.9.0's trainer on the same samples, per algorithm."""
    rows, used = [], []
    for algo, k, side, path in _training():
        run = train_sides(path, algo)
        ours, theirs = (run[s]["speed"]["tokens_per_cpu_s"] for s in (side, "speculators"))
        rows.append([algo, "bf16 autocast (ours)" if side == "ours-bf16" else "fp32", k, f"{ours:.0f}",
                     f"{theirs:.0f}", f"{ours / theirs:.2f}×", f"`{path}`"])
        used.append(path)
    return table(["algorithm", "precision", "CPU kind", "ours", "speculators 0.9.0 (fp32)", "ours ÷ speculators'",
                  "record"], rows) + [""] + how_measured(used)


def train_outcome() -> list[str]:
    """τ at k = 3 of the drafts both trainers made from the same samples, scored by the same evaluator."""
    rows, used = [], []
    for algo, k, side, path in _training():
        if side != "ours":
            continue
        run = train_sides(path, algo)
        (ours, every), (theirs, _) = train_tau(run["ours"]), train_tau(run["speculators"])
        rows.append([algo + (" (every draft verified)" if every else ""), k, run["ours"]["eval"]["num_samples"],
                     tau(ours), tau(theirs), signed(ours - theirs, 3), f"`{path}`"])
        used.append(path)
    for path in newest(found(PAIRED_TAU)):
        d = need(path, "difference")
        rows.append([f"{paired_algorithm(path)} (paired, per sample)", kind(path),
                     d["n"], tau(need(path, "ours", "tau")), tau(need(path, "theirs", "tau")),
                     f"{signed(d['mean'], 4)} (95%: {signed(d['ci95'][0], 4)} to {signed(d['ci95'][1], 4)})",
                     f"`{path}`"])
        used.append(path)
    return table(["algorithm", "CPU kind", "held-out samples", "ours", "speculators 0.9.0", "ours − speculators'",
                  "record"], rows) + [""] + how_measured(used)


def data_cost() -> list[str]:
    """Seconds per conversation to make a draft's data: the target's answer and the hidden states it reads."""
    rows = []
    for path in DATA_COST:
        for way, regenerate, extract, total in data_ways(path):
            rows.append([kind(path), way, "–" if regenerate is None else f"{regenerate:.2f}",
                         "–" if extract is None else f"{extract:.2f}", f"{total:.2f}", f"`{path}`"])
    return table(["CPU kind", "way", "regenerate", "extract", "total", "record"], rows) + [""] + \
        how_measured(DATA_COST)


def levers() -> list[str]:
    """Per workload, what decoding measured for the draft, n-gram and each lever's best forecast setting, with the
    evaluator's tokens per step and forecast of the same setting beside it."""
    rows, used = [], []
    for path in newest(found(LEVERS)):
        for workload, w in need(path, "workloads").items():
            for name, d in w["decoded"].items():
                if name == "baseline":
                    continue
                f = next((r for r in w["forecasts"] if r["method"] == d.get("method")
                          and r["p_min"] == d.get("p_min") and r.get("ngram_min_match") == d.get("ngram_min_match")
                          and r["k"] == d.get("k")), {})
                per_step = f.get("tokens_per_step")
                rows.append([workload, re.sub(r" k\d+$", "", name), d.get("k") or "–", tau(d["mean_acceptance_length"]),
                             "–" if per_step is None else f"{per_step:.2f}", times(d["speedup"], d.get("ci95")),
                             times(f.get("forecast_speedup")), yes(d["identical_to_baseline"]), kind(path),
                             path_name(need(path, "kernel")), f"`{path}`"])
        used.append(path)
    return table(["workload", "proposer", "k", "τ", "tokens / step", "speedup (95% interval)",
                  "forecast (evaluator)", "answers = baseline's", "CPU kind", "target path", "record"], rows) + \
        [""] + how_measured(used)


def levers_llamacpp() -> list[str]:
    """llama.cpp beside its F32 target: the shipped draft (and draft + ngram-mod) at each --spec-draft-p-min, with
    n-gram from the run without a cut."""
    rows, used = [], []
    paths = newest(found(LEVERS_LLAMACPP), ties=True)
    for path in sorted(paths, key=lambda p: need(p, "p_min") or 0.0):
        p_min = need(path, "p_min")
        for name, m in bench_methods(path).items():
            if name == "baseline" or (name == "ngram" and p_min):
                continue
            rows.append([name, "–" if name == "ngram" else (f"{p_min:g}" if p_min else "off"), need(path, "k"),
                         tau(m["mean_acceptance_length"]), times(m["speedup"], (m.get("spread") or {}).get("ci95")),
                         f"{m['num_draft_tokens'] / m['tokens']:.2f}", yes(m["identical_to_baseline"]), kind(path),
                         f"GGUF {need(path, 'gguf_target')}", f"`{path}`"])
        used.append(path)
    return table(["proposer", "p-min", "k", "τ", "speedup (95% interval)", "drafted per output token",
                  "answers = baseline's", "CPU kind", "target", "record"], rows) + [""] + how_measured(used)


def gpu() -> list[str]:
    """The GPU check's records, or that none is committed."""
    paths = found(GPU)
    if not paths:
        return ["No record under `benchmarks/results/gpu_check/`: `benchmarks/gpu_check.py` has not run on a GPU "
                "(none was available); on a CPU every check prints SKIP."]
    return how_measured(paths)


TABLES: dict[str, Callable[[], list[str]]] = {
    "shipped-drafts": shipped_drafts, "best-k": best_k, "engines": engines, "tau-protocols": tau_protocols,
    "baseline": baseline, "train-speed": train_speed, "train-outcome": train_outcome, "data-cost": data_cost,
    "levers": levers, "levers-llamacpp": levers_llamacpp, "gpu": gpu}


# ------------------------------------------------------------------------------------------------------ blocks


def render(name: str) -> str:
    """The block `name` as the records give it."""
    return "\n".join(TABLES[name]())


def blocks(text: str) -> dict[str, str]:
    """Each generated block of `text`, by name, as written (between its markers)."""
    names = re.findall(r"<!-- table:([\w-]+) -->", text)
    out = {}
    for name in names:
        begin, end = BEGIN.format(name), END.format(name)
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(end) < text.index(begin):
            raise RecordError(f"{name}: one {begin} then one {end}")
        out[name] = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    return out


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the block `name` holding `body`."""
    begin, end = BEGIN.format(name), END.format(name)
    if begin not in text or end not in text:
        raise RecordError(f"no {begin} … {end} in the document")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def write(doc: Path = DOC, names: Iterable[str] | None = None) -> list[str]:
    """Rewrite the blocks (all of the document's, or `names`) from the records; the names that changed."""
    from engine.fsutil import atomic_write_text

    text = doc.read_text()
    unknown = set(blocks(text)) - set(TABLES)
    if unknown:
        raise RecordError(f"{doc.name} has blocks no table makes: {sorted(unknown)}")
    changed = []
    for name in names or blocks(text):
        new = replace_block(text, name, render(name))
        if new != text:
            changed.append(name)
        text = new
    atomic_write_text(doc, text)
    return changed


def check(doc: Path = DOC) -> list[str]:
    """The blocks of the document that differ from what the records give, and the tables it lacks."""
    written = blocks(doc.read_text())
    return [name for name in TABLES if written.get(name) != render(name)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="rewrite the document's tables from the records")
    what.add_argument("--check", action="store_true", help="exit 1 if a table differs from the records'")
    what.add_argument("--show", metavar="TABLE", choices=sorted(TABLES), help="print one table")
    p.add_argument("--doc", type=Path, default=DOC)
    a = p.parse_args(argv)
    if a.show:
        print(render(a.show))
        return 0
    if a.write:
        changed = write(a.doc)
        print(f"wrote {a.doc}" + (f" ({', '.join(changed)} changed)" if changed else " (no change)"))
        return 0
    stale = check(a.doc)
    for name in stale:
        print(f"{a.doc.name}: table {name!r} is not what the records give; run python benchmarks/report.py --write",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
