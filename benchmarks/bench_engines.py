"""One acceptance, every engine, and the forecast against the measurement: per draft and workload, τ from the
evaluator, in-process, llama.cpp (and vLLM where its CPU build serves the type), the speedup each engine's forecast
gives, and the speedup each engine measures, on the same prompts.

    python benchmarks/bench_engines.py --drafts assets/drafts/*-eagle3 --workloads general,sharegpt --json OUT
"""

# Per (draft, workload), one at a time, resumable (rows already in --json are kept):
# - evaluate at the in-process path `auto` picks, with the in-process forecast (its step costs measured here), and
#   evaluate on the fp32 target with the llama.cpp forecast (llama-server's step costs measured here beside the F32
#   GGUF: the weights llama.cpp decodes), both on the workload's prompts;
# - bench in-process (baseline, draft) at `auto`, and bench --backend llama.cpp (baseline, draft, ngram) at F32;
# - with --vllm, bench --backend vllm (baseline, draft) in fp32, where the CPU build serves the draft's type.
# Forecast error = forecast - measured speedup, per engine (llama.cpp: of its own generation rate, which leaves the
# prompt's pass out, as the forecast does; in-process: whole answers); τ agreement = each engine's τ - the evaluator's.

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import command_line, print_and_save  # noqa: E402


def _evaluate(draft: str, workload: str, a, *, dtype: str, engine: str) -> dict:
    from engine.measure.evaluate import evaluate_draft
    from engine.measure.options import EvaluateOptions

    return evaluate_draft(EvaluateOptions(draft=draft, dataset=workload, num_prompts=a.num_prompts,
                                          max_new_tokens=a.max_new_tokens, k=[a.k], dtype=dtype, forecast=True,
                                          forecast_engines=[engine]), progress=False)


def _bench(draft: str, workload: str, a, **fields) -> dict:
    from engine.measure.bench import benchmark
    from engine.measure.options import BenchOptions

    return benchmark(BenchOptions(draft=draft, prompts=workload, num_prompts=a.num_prompts,
                                  max_new_tokens=a.max_new_tokens, k=a.k, **fields))


def _method(result: dict, name: str) -> dict:
    m = result["methods"].get(name) or {}
    out = {"tau": m.get("mean_acceptance_length"), "speedup": m.get("speedup"),
           "identical": m.get("identical_to_baseline"), "tokens_per_s": m.get("tokens_per_s"),
           "ci95": (m.get("spread") or {}).get("ci95")}
    if "whole_speedup" in m:  # llama.cpp: `speedup` is of its own generation rate; whole requests beside it
        out["whole_speedup"] = m["whole_speedup"]
        out["identical_prompts"] = m.get("identical_prompts")
        out["first_divergence"] = m.get("first_divergence")
    return out


def row(draft: str, workload: str, a) -> dict:
    """Every figure of one (draft, workload)."""
    k = str(a.k)
    started = time.time()
    ev_auto = _evaluate(draft, workload, a, dtype="auto", engine="in-process")
    ev_f32 = _evaluate(draft, workload, a, dtype="float32", engine="llama.cpp")
    inproc = _bench(draft, workload, a, methods="baseline,draft")
    llama = _bench(draft, workload, a, backend="llama.cpp", methods="baseline,draft,ngram")
    out = {
        "draft": draft, "workload": workload, "k": a.k,
        "evaluate": {"auto": ev_auto["by_k"][k]["mean_acceptance_length"], "auto_dtype": ev_auto["target_dtype"],
                     "fp32": ev_f32["by_k"][k]["mean_acceptance_length"]},
        "in_process": {**_method(inproc, "draft"), "kernel": (inproc.get("kernel") or {}).get("path"),
                       "forecast": ev_auto["forecast"]["by_k"][k]["speedup"]},
        "llama_cpp": {**_method(llama, "draft"), "ngram": _method(llama, "ngram"),
                      "forecast": ev_f32["forecast_llamacpp"]["by_k"][k]["speedup"],
                      "step_cost": ev_f32["costs_llamacpp"]["step_cost"][k],
                      "target_step_ms": ev_f32["costs_llamacpp"]["target_step_ms"],
                      "advice": ev_f32["forecast_llamacpp"]["advice"]},
    }
    if a.vllm:
        out["vllm"] = _vllm(draft, workload, a)
    for engine in ("in_process", "llama_cpp"):
        e = out[engine]
        e["forecast_error"] = e["forecast"] - e["speedup"] if e["forecast"] and e["speedup"] else None
    out["seconds"] = round(time.time() - started, 1)
    return out


def _vllm(draft: str, workload: str, a) -> dict:
    from engine.errors import WorkbenchError

    try:
        return _method(_bench(draft, workload, a, backend="vllm", methods="baseline,draft", dtype="float32"),
                       "draft")
    except WorkbenchError as exc:  # the CPU build refuses the type: say so in the row
        return {"refused": str(exc).splitlines()[0]}


def table(rows: list[dict]) -> str:
    lines = ["| draft | workload | τ evaluate (auto / fp32) | τ in-process | τ llama.cpp | in-process: forecast / "
             "measured | llama.cpp: forecast / measured | llama.cpp n-gram | identical (in-process, llama.cpp) |",
             "|---|---|---|---|---|---|---|---|---|"]
    f = lambda x: f"{x:.3f}" if isinstance(x, float) else "–"  # noqa: E731
    s = lambda x: f"{x:.2f}×" if isinstance(x, float) else "–"  # noqa: E731
    for r in rows:
        i, lc = r["in_process"], r["llama_cpp"]
        lines.append(f"| {Path(r['draft']).name} | {r['workload']} | {f(r['evaluate']['auto'])} / "
                     f"{f(r['evaluate']['fp32'])} | {f(i['tau'])} | {f(lc['tau'])} | {s(i['forecast'])} / "
                     f"{s(i['speedup'])} | {s(lc['forecast'])} / {s(lc['speedup'])} | {s(lc['ngram']['speedup'])} | "
                     f"{i['identical']}, {lc['identical']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafts", nargs="+", help="draft folders (required but with --write-benchmarks)")
    p.add_argument("--workloads", default="general,sharegpt,humaneval", help="built-in workloads or prompts files")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--vllm", action="store_true", help="also bench in vLLM's CPU build (fp32)")
    p.add_argument("--json", help="the record (rows already in it are kept and skipped)")
    p.add_argument("--write-cards", action="store_true", help="put each draft's rows into its model card (README.md)")
    p.add_argument("--reforecast", action="store_true", help="measure llama.cpp's step costs again for every row of "
                   "--json and replace its forecast (the measured speeds stay)")
    p.add_argument("--write-benchmarks", nargs="*", metavar="RECORD",
                   help="only regenerate BENCHMARKS.md's engines table (no measuring), from the records "
                   "benchmarks/report.py names (given here, they must be those)")
    a = p.parse_args(argv)
    if a.write_benchmarks is not None:
        write_benchmarks(a.write_benchmarks)
        return 0
    if not a.drafts:
        p.error("--drafts is required")
    if a.reforecast:
        return reforecast(a, argv)
    done = json.loads(Path(a.json).read_text()).get("rows", []) if a.json and Path(a.json).is_file() else []
    rows = list(done)
    for draft in a.drafts:
        for workload in a.workloads.split(","):
            if any(r["draft"] == draft and r["workload"] == workload for r in rows):
                continue
            print(f"{draft} on {workload} ...", file=sys.stderr, flush=True)
            rows.append(row(draft, workload, a))
            result = {"command": command_line("bench_engines.py", argv), "rows": rows, "k": a.k,
                      "num_prompts": a.num_prompts, "max_new_tokens": a.max_new_tokens,
                      "dtypes": ["auto (in-process)", "fp32 (evaluate for llama.cpp)", "gguf f32 (llama.cpp)"]}
            print_and_save(result, table(rows), a.json)
    if a.write_cards and a.json:
        write_cards(a.drafts, a.json)
    return 0


def reforecast(a, argv: list[str] | None) -> int:
    """llama.cpp's forecast of every row again (the evaluator's answers are cached; the step costs measured anew)."""
    record = json.loads(Path(a.json).read_text())
    for r in record["rows"]:
        print(f"{r['draft']} on {r['workload']}: llama.cpp's step costs again ...", file=sys.stderr, flush=True)
        a.k = r["k"]
        ev = _evaluate(r["draft"], r["workload"], a, dtype="float32", engine="llama.cpp")
        lc, k = r["llama_cpp"], str(r["k"])
        costs, fc = ev["costs_llamacpp"], ev["forecast_llamacpp"]
        lc.update(forecast=fc["by_k"][k]["speedup"], step_cost=costs["step_cost"][k],
                  target_step_ms=costs["target_step_ms"], advice=fc["advice"], calibration=costs)
        lc["forecast_error"] = lc["forecast"] - lc["speedup"] if lc["forecast"] and lc["speedup"] else None
    record["reforecast_command"] = command_line("bench_engines.py", argv)
    print_and_save(record, table(record["rows"]), a.json)
    return 0


def write_benchmarks(records: list[str]) -> None:
    """BENCHMARKS.md's engines table, through benchmarks/report.py (its block `engines`, from the records it names)."""
    from benchmarks import report

    named = [str(Path(r).resolve().relative_to(report.RESULTS)) if Path(r).resolve().is_relative_to(report.RESULTS)
             else r for r in records]
    if named and named != report.ENGINES:
        raise SystemExit(f"BENCHMARKS.md's engines table reads the records benchmarks/report.py names in ENGINES "
                         f"({report.ENGINES}): name {named} there, then run python benchmarks/report.py --write")
    report.write(names=["engines"])
    print(f"wrote {report.DOC}")


def write_cards(drafts: list[str], record_path: str) -> None:
    """Each draft's section of the record, into its card (the record as saved, its provenance included)."""
    from engine.recipes.model_card import write_engines_section

    record = json.loads(Path(record_path).read_text())
    where = str(Path(record_path).resolve().relative_to(Path(__file__).resolve().parents[1]))
    for draft in drafts:
        print(f"wrote {write_engines_section(Path(draft) / 'README.md', record, draft, where)}")


if __name__ == "__main__":
    raise SystemExit(main())
