"""Glue for the offline evaluator in the app: its command line, where its results land, and their table rows."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import jobs as engine_jobs
from engine.data.prompts.workloads import WORKLOADS
from engine.measure.evaluate import p_min_advice, workload_cell
from engine.measure.options import EvaluateOptions
from engine.measure.step_costs import measured_recommendation
from engine.measure.step_costs import recommendation as words
from ui import records
from ui.jobs import argv_value
from ui.proposers import settings_text


def result_path(draft: str) -> str:
    return str(engine_jobs.runs_dir() / "evaluate" / f"{Path(draft).name}-{time.strftime('%Y%m%d-%H%M%S')}.json")


def evaluate_argv(draft: str, target: str, *, num_prompts: int, max_new_tokens: int, out: str,
                  forecast: bool = True, workloads: list[str] | None = None, llamacpp: bool = False,
                  method: str = "draft", p_min: float | None = None, ngram_min_match: int | None = None) -> list[str]:
    """The evaluate job's command; `workloads` (built-in names or prompts files) add a row each of acceptance per k
    with its spread over prompts; `llamacpp` forecasts llama.cpp's speedup too; `method` draft_ngram walks draft +
    n-gram (with its `ngram_min_match`), `p_min` (0 = off) the draft's confidence cut."""
    options = EvaluateOptions(draft=draft, target=target, num_prompts=num_prompts, max_new_tokens=max_new_tokens)
    if method != "draft":
        options.method = method
        if ngram_min_match is not None:
            options.ngram_min_match = int(ngram_min_match)
    if p_min:
        options.p_min = float(p_min)
    if forecast:
        options.forecast = True
        if llamacpp:
            options.forecast_engines = ["in-process", "llama.cpp"]
    if workloads:
        options.workloads = list(workloads)
    return [*options.argv("evaluate"), "--json", out]


def workload_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per workload: its kind, prompts, and per k the mean acceptance length with its 95% interval."""
    return [{"workload": Path(row["workload"]).name if row["kind"] == "your prompts" else row["workload"],
             "kind": row["kind"], "prompts": row["held_out_prompts"],
             **{f"k = {k}": workload_cell(spread) for k, spread in row["by_k"].items()}}
            for row in result.get("by_workload") or []]


def results(draft: str | None = None) -> list[tuple[engine_jobs.Job, dict[str, Any]]]:
    """Finished evaluate jobs (newest first) with their JSON, optionally only those of one draft folder."""
    found = []
    for job in engine_jobs.list_jobs(engine_jobs.runs_dir()):
        if job.kind != "evaluate" or job.status.state != "done":
            continue
        if draft is not None and str(Path(argv_value(job, "--draft") or "").resolve()) != str(Path(draft).resolve()):
            continue
        out = argv_value(job, "--json")
        try:
            found.append((job, json.loads(Path(out).read_text())))
        except (OSError, TypeError, ValueError):
            continue
    return found


@dataclass
class Evaluation:
    """One evaluation's result and where it comes from (a job of yours, or a record shipped in benchmarks/results)."""

    result: dict[str, Any]
    where: str        # "your job ID · this machine (CPU), DATE" / "shipped evaluate/NAME.json · another machine: ..."
    here: bool        # measured on a CPU of this machine's kind (a job of yours always is)
    date: str | None
    job: engine_jobs.Job | None = None

    @property
    def shipped(self) -> bool:
        """A record that came with the project: it never ran on this machine, whatever its CPU kind."""
        return self.job is None


def shipped_results(draft: str | None = None) -> list[Evaluation]:
    """The evaluator's records under benchmarks/results/ (per-k `by_k` tables), optionally of one draft only."""
    found = {}
    for path in records.shipped_json(lambda d: isinstance(d, dict) and isinstance(d.get("by_k"), dict)
                                     and "draft" in d):
        result = json.loads(path.read_text())
        if draft is None or records.measured(result, draft):
            found[path] = result
    if draft is not None:  # a re-shipped draft keeps its folder: only evaluations of its current weights
        these = records.of_these_weights(found, draft)
        found = {path: result for path, result in found.items() if path in these}
    return [Evaluation(result, f"shipped `{path.relative_to(records.SHIPPED)}` · "
                       f"{records.provenance(result, path, shipped=True)}",
                       records.on_this_machine(result), records.date_of(result, path))
            for path, result in found.items()]


def all_results(draft: str | None = None) -> list[Evaluation]:
    """Your evaluations (newest first), then the shipped ones with this machine's CPU (newest first), then the
    others: the first one is the freshest for this machine."""
    mine = [Evaluation(result, f"your job `{job.id}` · " + (records.provenance(result) if result.get("cpu")
                                                            else "this machine"),
                       True, time.strftime("%Y-%m-%d", time.localtime(job.created)), job)
            for job, result in results(draft)]
    shipped = sorted(shipped_results(draft), key=lambda e: e.date or "", reverse=True)
    shipped.sort(key=lambda e: not e.here)  # stable: this machine's first, each group newest first
    return mine + shipped


def cut_advice(result: dict[str, Any]) -> str:
    """The confidence cut's forecast beside the plain draft's, in words ("" for a result without one)."""
    said = p_min_advice(result)
    return said[:1].upper() + said[1:] + "." if said else ""


def recommendation(result: dict[str, Any], here: bool = True, speed: dict[str, Any] | None = None, *,
                   shipped: bool = False) -> str:
    """The advice in words: the best measured k of the draft's k sweep on a CPU of this kind (`speed`, from
    ui.bench.draft_speed, when it measured every k) with the forecast beside it and its error; else the forecast's
    (never a k whose forecast is below 1×); "" with neither (`shipped`: a record that never ran here)."""
    if speed and speed.get("rows") and speed.get("here"):
        return measured_recommendation(speed["rows"], result.get("forecast"), ngram=speed.get("ngram_speedup"),
                                       where=_where(True, bool(speed.get("shipped"))))
    return words(result.get("forecast"), _where(here, shipped))


def _where(here: bool, shipped: bool) -> str:
    """Where a figure was measured, in words: "this machine" only for what ran here."""
    if not here:
        return "on the machine it was measured on"
    return f"on {records.SAME_KIND}" if shipped else "on this machine"


def counted(n: Any, noun: str) -> str:
    """A count with its noun in the right number: "1 held-out prompt", "20 held-out prompts"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def size(result: dict[str, Any]) -> int:
    """How much an evaluation measured: held-out prompts × new tokens."""
    return int(result.get("num_samples") or 0) * int(result.get("max_new_tokens") or 0)


def protocol(result: dict[str, Any]) -> str:
    """An evaluation's size and protocol in words: prompts × tokens, its k, the target's kernel path, the proposer
    walked (its p-min and n-gram rule), the engines."""
    ks = [int(k) for k in result.get("by_k") or {}]
    kernel = str(result.get("kernel") or "").split(" (")[0] or "not recorded"
    kernel += " (chosen under load)" if "measured under load" in str(result.get("kernel") or "") else ""
    engines = ["in-process"] if result.get("forecast") else []
    engines += ["llama.cpp"] if result.get("forecast_llamacpp") else []
    return (f"{counted(result.get('num_samples'), 'held-out prompt')} × "
            f"{counted(result.get('max_new_tokens'), 'new token')}"
            + (f" · k = {min(ks)}–{max(ks)}" if len(ks) > 1 else f" · k = {ks[0]}" if ks else "")
            + f" · kernel {kernel} · proposer: {proposer(result)} · acceptance: in-process walk"
            + (f", forecast: {' and '.join(engines)}" if engines else ", no forecast"))


def proposer(result: dict[str, Any]) -> str:
    """The proposer an evaluation walked, in words: "draft", "draft, p-min 0.30", "draft + n-gram (min match 3)"
    (an older result, without `proposer`, walked the plain draft)."""
    return settings_text(result.get("proposer"))


def largest(evaluations: list[Evaluation]) -> Evaluation | None:
    """The evaluation to open on: the largest (prompts × tokens), the first of equals (yours, freshest first), so a
    smaller run never replaces a larger one unasked."""
    return max(evaluations, key=lambda e: size(e.result), default=None)


def label(ev: Evaluation) -> str:
    """One evaluation in a picker: its size and protocol, then where and when it was measured."""
    return f"{protocol(ev.result)} · {ev.where}"


def choose(evaluations: list[Evaluation], key: str) -> Evaluation:
    """A picker of every evaluation by size and protocol, opening on the largest; it follows a new largest one, and
    keeps a choice of the user's until then."""
    import streamlit as st

    labels = {label(e): e for e in evaluations}
    default = label(largest(evaluations))
    if st.session_state.get(f"{key}_default") != default or st.session_state.get(key) not in labels:
        st.session_state[f"{key}_default"] = st.session_state[key] = default
    picked = st.selectbox("Evaluation shown", list(labels), key=key, width="stretch",
                          help="Every evaluation of this draft: yours (newest first), then the shipped records. It "
                               "opens on the largest (held-out prompts × new tokens): a smaller run is listed, it "
                               "does not replace a larger one.")
    return labels[picked]


def smaller_and_newer(evaluations: list[Evaluation], shown: Evaluation) -> list[Evaluation]:
    """Your evaluations fresher than the one shown and smaller than it (listed in the picker, not shown)."""
    fresher = evaluations[: evaluations.index(shown)]
    return [e for e in fresher if not e.shipped and size(e.result) < size(shown.result)]


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per k: the walk's acceptance, per position, the all-positions average, the forecast speedup in-process
    and in llama.cpp (their columns only when the evaluation made them)."""
    fc = (result.get("forecast") or {}).get("by_k", {})
    fl = (result.get("forecast_llamacpp") or {}).get("by_k", {})
    rows = []
    for key, acc in result.get("by_k", {}).items():
        row = {"k": int(key),
               "mean acceptance length (decoding walk)": _round(acc.get("mean_acceptance_length")),
               "per-position acceptance": ", ".join(f"{x:.2f}" for x in acc.get("per_position_acceptance", [])),
               "all-positions average": _round(acc.get("all_positions_acceptance_length"))}
        if fc:
            f = fc.get(key) or {}
            row |= {"step cost (target steps)": _round(f.get("step_cost")),
                    "forecast speedup": _round(f.get("speedup")), **_costs_flag(result["forecast"])}
        if fl:
            f = fl.get(key) or {}
            row |= {"llama.cpp step cost (baseline tokens)": _round(f.get("step_cost")),
                    "llama.cpp forecast": _round(f.get("speedup"))}
        rows.append(row)
    return rows


def _costs_flag(fc: dict[str, Any]) -> dict[str, str]:
    """A column that flags a forecast whose step costs were measured under load (or implausibly); none otherwise."""
    label = str(fc.get("label") or "")
    return {"step costs measured": "under load" if label.startswith("under load") else "implausibly"} if label else {}


def columns() -> dict[str, Any]:
    """The evaluator's table: the forecast with its unit, 2 decimals."""
    import streamlit as st

    return {"forecast speedup": st.column_config.NumberColumn(format="%.2f×"),
            "llama.cpp forecast": st.column_config.NumberColumn(format="%.2f×"),
            "mean acceptance length (decoding walk)": st.column_config.NumberColumn(format="%.3f")}


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


__all__ = ["WORKLOADS", "Evaluation", "all_results", "choose", "counted", "evaluate_argv", "label", "largest",
           "proposer", "protocol", "recommendation", "result_path", "results", "shipped_results", "size",
           "smaller_and_newer", "table_rows", "workload_rows"]
