"""Glue for the Benchmarks page: the bench command line and the result files of finished bench jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from engine import jobs as engine_jobs
from engine.cpu import load_text, under_load
from engine.errors import WorkbenchError
from engine.measure.options import ALL_METHODS, BACKEND_METHODS, BenchOptions
from ui import records
from ui.evaluate import counted
from ui.jobs import argv_value
from ui.proposers import p_min_problem as draft_p_min_problem

METHODS = ALL_METHODS
BACKENDS = list(BACKEND_METHODS)
DRAFT_METHODS = ("draft", "draft_ngram")  # the methods that run the draft
BACKEND_WORDS = {"transformers": "in process", "vllm": "a real vLLM server (needs the vLLM environment)",
                 "llama.cpp": "real llama-servers (built once), the draft exported to GGUF; its draft_ngram mixes the "
                              "draft with llama.cpp's ngram-mod"}
METHODS_HELP = ("baseline: the target alone; draft: the active draft; ngram: prompt lookup; hf_prompt_lookup and "
                "hf_assisted: transformers' own; draft_ngram: per step the n-gram's proposal where its match is long "
                "enough, else the draft's.")


def methods_for(backend: str, has_draft: bool) -> list[str]:
    """The methods a backend runs (engine.measure.options.BACKEND_METHODS), those of a draft only with one."""
    return [m for m in BACKEND_METHODS[backend] if m not in DRAFT_METHODS or has_draft]


def backend_help() -> str:
    """The Backend field's help: what each backend is and the methods it runs."""
    return "; ".join(f"{b}: {BACKEND_WORDS.get(b, b)} (methods: {', '.join(m)})" for b, m in BACKEND_METHODS.items())


def p_min_problem(backend: str, draft: str | None) -> str | None:
    """Why the p-min input is off for this backend and draft, in words; None where the bench applies it."""
    if not draft:
        return "no draft is active (it cuts a draft's chain)"
    if backend == "vllm":
        return "the vLLM backend takes none here (in-process and llama.cpp do)"
    return draft_p_min_problem(draft) if backend == "transformers" else None  # llama.cpp: --spec-draft-p-min


def min_match_problem(backend: str) -> str | None:
    """Why the n-gram min match input is off for this backend; None in process, where draft_ngram takes it."""
    if backend == "llama.cpp":
        return "llama.cpp's draft_ngram uses its own ngram-mod rule, not this one"
    if "draft_ngram" not in BACKEND_METHODS[backend]:
        return f"the {backend} backend does not run draft_ngram"
    return None


def bench_argv(values: dict[str, Any], json_out: str) -> list[str]:
    """The `bench` command of the form's values (BenchOptions fields), its result written to `json_out`: the draft
    and its p-min (0 = off) only where a draft method runs, the n-gram min match only where draft_ngram runs in
    process."""
    given = {name: value for name, value in values.items() if value is not None}
    methods = given.get("methods", [])
    if not set(DRAFT_METHODS) & set(methods):
        given.pop("draft", None)
        given.pop("p_min", None)
    if not given.get("p_min"):
        given.pop("p_min", None)
    if "draft_ngram" not in methods or min_match_problem(given.get("backend", "transformers")):
        given.pop("ngram_min_match", None)
    return [*BenchOptions(**given).argv("bench"), "--json", json_out]


def new_json_path() -> str:
    return str(engine_jobs.runs_dir() / "bench" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json")


def result_path(job: engine_jobs.Job) -> Path | None:
    path = job.status.result.get("json") or argv_value(job, "--json")
    return Path(path) if path else None


SHIPPED = records.SHIPPED  # results that ship with the project
SHIPPED_PREFIX = "shipped · "


def shipped_results() -> dict[str, Path]:
    """The `bench --json` results under benchmarks/results/ (other benchmark outputs live beside them), keyed
    "shipped · PATH" (PATH relative to benchmarks/results)."""
    return {SHIPPED_PREFIX + str(p.relative_to(SHIPPED)): p
            for p in records.shipped_json(lambda d: isinstance(d, dict) and isinstance(d.get("methods"), dict))}


def _record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def freshest_for_this_machine(files: dict[str, Path]) -> str | None:
    """The result to open on: the user's newest run (made here), else the newest shipped result whose CPU is this
    machine's, else the newest of another machine (of one day, one measured in rounds before a single run, and
    in-process before vLLM)."""
    user = [key for key in files if not key.startswith(SHIPPED_PREFIX)]
    if user:
        return user[0]
    # same day: measured in repeated rounds (one speed per k, with its spread) first, then in-process
    loaded = {key: _record(p) for key, p in files.items()}
    ranked = {key: (records.date_of(rec, files[key]) or "", bool(rec.get("rounds_kept")),
                    rec.get("backend") in (None, "transformers"), key) for key, rec in loaded.items()}
    here = [rank for key, rank in ranked.items() if records.on_this_machine(loaded[key])]
    return max(here or ranked.values(), default=(None,))[-1]


def opening_result(files: dict[str, Path], draft: str | None) -> str | None:
    """The result the Benchmarks page opens on: the one every page quotes for the active draft's speed
    (`draft_speed`), else the freshest result for this machine."""
    speed = draft_speed(draft)
    return speed["key"] if speed and speed["key"] in files else freshest_for_this_machine(files)


def provenance(key: str, files: dict[str, Path]) -> str:
    path = files.get(key)
    if path is None:
        return ""
    if not key.startswith(SHIPPED_PREFIX):
        return records.provenance(_record(path)) if _record(path).get("cpu") else "this machine (your run)"
    return records.provenance(_record(path), path, shipped=True)


def of_this_kind(where: str) -> bool:
    """A provenance (`provenance`) of this machine, or of a shipped record from a CPU of this machine's kind."""
    return where.startswith(("this machine", records.SAME_KIND))


def user_results() -> dict[str, Path]:
    """Finished bench jobs whose JSON exists, newest first, plus loose files under runs/bench/."""
    out: dict[str, Path] = {}
    for job in engine_jobs.list_jobs():
        if job.kind == "bench":
            p = result_path(job)
            if p is not None and p.is_file():
                out[f"{job.id}"] = p
    loose = engine_jobs.runs_dir() / "bench"
    if loose.is_dir():
        for p in sorted(loose.glob("*.json"), reverse=True):
            if p not in out.values():
                out[p.name] = p
    return out


def results() -> dict[str, Path]:
    """The user's runs (newest first), then the shipped results: a run of one's own is not lost below dozens of
    shipped records in the picker's list."""
    return user_results() | shipped_results()


def label(key: str, files: dict[str, Path] | None = None) -> str:
    """"shipped · NAME · this machine (CPU), DATE" / "your run · JOB": what it is and where it was measured."""
    where = provenance(key, files) if files else ""
    name = key if key.startswith(SHIPPED_PREFIX) else f"your run · {key}"
    return f"{name} · {where}" if where else name


def load(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"cannot read {path}: {exc}", hint="choose a JSON written by `bench --json`") from exc
    return check(data)


def check(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("methods"), dict):
        raise WorkbenchError("this JSON has no 'methods' object", hint="use a file written by `python -m engine bench "
                             "--json FILE`")
    return data


def num_prompts(result: dict[str, Any]) -> int | None:
    """bench JSONs say `num_prompts` (transformers backend) or `prompts` (vllm backend)."""
    n = result.get("num_prompts", result.get("prompts"))
    return n if isinstance(n, int) else None


def _short(name: Any) -> str:
    """A folder's name; for a run's generic `draft` or `step_N` folder, with the two above it (whose run it is)."""
    text = str(name)
    if "/" not in text:
        return text
    parts = Path(text).parts
    generic = parts[-1] == "draft" or parts[-1].startswith("step_")
    return Path(*parts[-3:]).as_posix() if generic else parts[-1]


short_name = _short


def describe(result: dict[str, Any]) -> str:
    """What was measured, from the fields present only (no "None prompts", no "on None")."""
    parts = []
    if result.get("target"):
        parts.append(f"target `{_short(result['target'])}`")
    if result.get("draft"):
        parts.append(f"draft `{_short(result['draft'])}`")
    if result.get("k") is not None:
        parts.append(f"k = {result['k']}")
    n, new = num_prompts(result), result.get("max_new_tokens")
    if n:
        parts.append(counted(n, "prompt") + (f" × up to {counted(new, 'new token')}" if new else ""))
    if result.get("temperature") is not None:
        parts.append("greedy" if not result["temperature"] else f"temperature {result['temperature']:g}")
    if result.get("p_min"):
        parts.append(f"p-min {float(result['p_min']):.2f}")
    where = result.get("backend") or ""
    if result.get("device"):
        where += f" on {result['device']}" + (f" ({result['threads']} threads)" if result.get("threads") else "")
    if result.get("dtype"):
        where += f" · {result['dtype']}"
    if where.strip():
        parts.append(where.strip())
    return " · ".join(parts)


def load_flags(result: dict[str, Any]) -> list[str]:
    """What in a bench result was measured under load, a sentence each: its rounds (`label`, engine.measure.speed),
    and the timings its kernel path was chosen from (engine.generate.kernel_choice)."""
    flags = [f"Speeds {result['label']}."] if _loaded_rounds(result) else []
    share = (result.get("kernel") or {}).get("other_load") if isinstance(result.get("kernel"), dict) else None
    if under_load(share):
        flags.append(f"The kernel path ({result['kernel'].get('path')}) was chosen from timings measured "
                     f"{load_text(share)}.")
    return flags


def _loaded_rounds(result: dict[str, Any]) -> bool:
    """No round of the result ran on a quiet machine (engine.measure.speed labels it so)."""
    return str(result.get("label") or "").startswith("under load")


def _fmt(value: Any, fmt: str, suffix: str = "") -> str:
    return format(value, fmt) + suffix if isinstance(value, (int, float)) and not isinstance(value, bool) else "–"


def drift(row: dict[str, Any]) -> dict[str, Any] | None:
    """For a method not identical to the baseline with per-prompt first divergences (vllm): where answers parted."""
    first = [d for d in row.get("first_divergence") or [] if d is not None]
    if row.get("identical_to_baseline") or not first:
        return None
    first.sort()
    return {"parted": len(first), "of": len(row["first_divergence"]), "earliest": first[0],
            "median": first[len(first) // 2]}


def identical_text(result: dict[str, Any], row: dict[str, Any]) -> str:
    if row.get("identical_to_baseline"):
        return "yes"
    d = drift(row)
    if result.get("backend") == "vllm" and d:
        return f"no: bf16 drift ({d['parted']}/{d['of']} prompts part, median at token {d['median']})"
    if result.get("backend") == "vllm":
        return "no: bf16 drift"
    if result.get("temperature"):
        return "no (sampled: same distribution, other samples)"
    return "no"


def table_raw(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method, numbers unrounded (the CSV export)."""
    rows = []
    for name, r in result["methods"].items():
        rows.append({"method": name, "skipped": r.get("skipped") or "",
                     "mean_acceptance_length": r.get("mean_acceptance_length"),
                     "acceptance_rate": r.get("acceptance_rate"),
                     "per_position_acceptance": " ".join(f"{x:.4f}" for x in r.get("per_position_acceptance") or []),
                     "tokens_per_s": r.get("tokens_per_s"), "speedup": r.get("speedup"),
                     "speedup_ceiling": r.get("speedup_ceiling"),
                     "identical_to_baseline": r.get("identical_to_baseline")})
    return rows


def table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method for display: rounded, units in the headers, "–" where a value does not apply."""
    rows = []
    for name, r in result["methods"].items():
        if r.get("skipped"):
            rows.append({"method": name, "mean acceptance length (tokens/step)": "–", "acceptance rate": "–",
                         "tokens/s": "–", "speedup": "–", "speedup ceiling": "–",
                         "identical to baseline": f"skipped: {r['skipped']}"})
            continue
        rows.append({"method": name,
                     "mean acceptance length (tokens/step)": _fmt(r.get("mean_acceptance_length"), ".2f"),
                     "acceptance rate": _fmt(r.get("acceptance_rate"), ".0%"),
                     "tokens/s": _fmt(r.get("tokens_per_s"), ".1f"),
                     "speedup": _fmt(r.get("speedup"), ".2f", "×"),
                     "speedup ceiling": _fmt(r.get("speedup_ceiling"), ".2f", "×"),
                     "identical to baseline": identical_text(result, r)})
    return rows


def per_prompt_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per prompt: its preview and, per method, acceptance length, speedup or where it parted from the
    baseline (whatever the JSON has); [] when the JSON has no per-prompt data."""
    methods = {m: r for m, r in result["methods"].items() if not r.get("skipped")}
    n = max([len(r.get("per_prompt") or r.get("outputs") or []) for r in methods.values()] + [0])
    if not n:
        return []
    previews = result.get("prompt_previews") or []
    base = (methods.get("baseline") or {}).get("per_prompt") or []
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"prompt": i + 1}
        if i < len(previews):
            row["text"] = previews[i]
        elif (methods.get("baseline") or {}).get("outputs"):
            row["baseline answer"] = " ".join(str(methods["baseline"]["outputs"][i]).split())[:100]
        for name, r in methods.items():
            pp = r.get("per_prompt") or []
            if i < len(pp):
                if pp[i].get("mean_acceptance_length") is not None:
                    row[f"{name} · acceptance length"] = round(pp[i]["mean_acceptance_length"], 2)
                if name != "baseline" and i < len(base) and pp[i].get("seconds") and base[i].get("seconds") \
                        and pp[i].get("tokens"):
                    rate = pp[i]["tokens"] / pp[i]["seconds"]
                    base_rate = base[i]["tokens"] / base[i]["seconds"]
                    row[f"{name} · speedup"] = round(rate / base_rate, 2)
            fd = r.get("first_divergence") or []
            if name != "baseline" and i < len(fd):
                row[f"{name} · parts from baseline at token"] = "–" if fd[i] is None else str(int(fd[i]))  # one type
        rows.append(row)
    return rows


def heatmap_data(result: dict[str, Any], method: str) -> tuple[list[list[float]], list[str]] | None:
    """Acceptance per position × prompt for one method: (z [prompt][position], y labels), or None."""
    pp = (result["methods"].get(method) or {}).get("per_prompt") or []
    z = [r.get("per_position_acceptance") or [] for r in pp]
    if not any(z):
        return None
    width = max(len(row) for row in z)
    return [row + [None] * (width - len(row)) for row in z], [f"prompt {i + 1}" for i in range(len(z))]


def to_csv(rows: list[dict[str, Any]]) -> str:
    import csv
    import io

    if not rows:
        return ""
    columns = list(dict.fromkeys(c for r in rows for c in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def draft_speed(draft: str | None) -> dict[str, Any] | None:
    """The freshest benchmark of this draft for this machine (your runs, then shipped records with this CPU, then
    the others): its measured speedup, acceptance, k, prompts and where/when, or None when none names it."""
    if not draft:
        return None
    files = results()
    loaded = {key: _record(p) for key, p in files.items()}  # each file read once
    measured = {key: rec for key, rec in loaded.items() if records.measured(rec, draft)
                and isinstance(((rec.get("methods") or {}).get("draft") or {}).get("speedup"), (int, float))}
    these = records.of_these_weights(measured, draft)
    in_process = {key for key in these if measured[key].get("backend") in (None, "transformers")}
    keep = in_process or these  # the engine the app runs, before real vLLM
    mine = {key: p for key, p in files.items() if key in keep}  # in results()' order: yours newest first
    key = freshest_for_this_machine(mine)
    if key is None:
        return None
    rec = _record(mine[key])
    row = rec["methods"]["draft"]
    return {"key": key, "path": str(mine[key]), "speedup": row["speedup"],
            "ci95": (row.get("spread") or {}).get("ci95"), "rounds": rec.get("rounds_kept"),
            "rows": rec.get("rows") if isinstance(rec.get("rows"), list) else None,  # every k, where a sweep
            "mean_acceptance_length": row.get("mean_acceptance_length"), "k": rec.get("k"),
            "prompts": num_prompts(rec), "max_new_tokens": rec.get("max_new_tokens"),
            "backend": rec.get("backend"), "here": records.on_this_machine(rec) or not key.startswith(SHIPPED_PREFIX),
            "shipped": key.startswith(SHIPPED_PREFIX),  # came with the project: never ran here, whatever its CPU
            "where": provenance(key, mine),
            "ngram_speedup": (rec["methods"].get("ngram") or {}).get("speedup"), "under_load": _loaded_rounds(rec)}


def draft_speed_text(speed: dict[str, Any] | None) -> str:
    """One sentence for every page that shows this draft's speed: the same record, the same words."""
    if not speed:
        return ""
    tau = speed.get("mean_acceptance_length")
    ngram = speed.get("ngram_speedup")
    ci = speed.get("ci95")
    return (f"Measured for this draft: **{speed['speedup']:.2f}×** the target alone"
            + (f" (95% interval {ci[0]:.2f}–{ci[1]:.2f} over {speed['rounds']} interleaved rounds)" if ci else
               " (one run, no spread)")
            + (f" (mean acceptance length {tau:.2f})" if tau else "")
            + (f", k = {speed['k']}" if speed.get("k") else "")
            + (f", {counted(speed['prompts'], 'prompt')} × up to {counted(speed['max_new_tokens'], 'new token')}"
               if speed.get("prompts")
               else "")
            + (f", {speed['backend']}" if speed.get("backend") else "")
            + (f"; n-gram {ngram:.2f}× in the same run" if isinstance(ngram, (int, float)) else "")
            + f" — {speed['where']} (`{speed['key'].removeprefix(SHIPPED_PREFIX)}`)."
            + (" :orange[Measured under load.]" if speed.get("under_load") else "")
            + verdict(speed))


def verdict(speed: dict[str, Any]) -> str:
    """What the record advises: never a proposer its own numbers show slower than another or than no speculation."""
    ngram, mine = speed.get("ngram_speedup"), speed["speedup"]
    if isinstance(ngram, (int, float)) and ngram > max(mine, 1.0):
        return " On these prompts **n-gram is faster** than this draft."
    if mine < 1.0:
        return " On these prompts this draft is **slower than no speculation**."
    return ""
