"""Every draft algorithm side by side on the same held-out prompts, in-process and in real vLLM, in one run."""

# Each method is `NAME=DRAFT_FOLDER@K` (a draft), `ngram@K` (prompt lookup) or `baseline`. In-process, one target is
# loaded on the engine's measured kernel path (`load_decode_target`; the record names it) and the methods run
# round-robin prompt by prompt (so they see the same machine load); the table has mean acceptance length,
# per-position acceptance, the draft's cost per step (ms, and as a fraction of one baseline target step), tokens/s,
# speedup and whether the output is identical to the baseline. With `--vllm`, the same prompts go through the
# managed vLLM server (one server per method, one after the other), with vLLM's own counters.
#
#     .venv/bin/python benchmarks/bench_drafters.py \
#         --method eagle3=assets/drafts/smollm2-135m-instruct-eagle3@3 \
#         --method dflash=assets/drafts/smollm2-135m-instruct-dflash@3 --method ngram@3 \
#         --num-prompts 20 --max-new-tokens 128 --vllm --json benchmarks/results/drafters/builtin.json

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)


@dataclass
class Method:
    """One column of the comparison: a name, a draft folder (None: baseline or ngram) and its k."""
    name: str
    draft: str | None = None
    k: int = 3
    kind: str = "draft"  # draft | ngram | baseline


def parse_method(spec: str) -> Method:
    """`baseline`, `ngram@K` or `NAME=FOLDER@K` -> Method."""
    if spec == "baseline":
        return Method("baseline", kind="baseline", k=1)
    if spec.startswith("ngram"):
        return Method("ngram", kind="ngram", k=int(spec.partition("@")[2] or 3))
    name, sep, rest = spec.partition("=")
    folder, _, k = rest.rpartition("@") if "@" in rest else (rest, "", "")
    if not sep or not folder:
        raise SystemExit(f"--method {spec!r}: write NAME=DRAFT_FOLDER@K, ngram@K or baseline")
    return Method(name, folder, int(k or 3))


@dataclass
class Tally:
    """What one method measured over all prompts in-process."""
    outputs: list[list[int]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    steps: int = 0
    metrics: Any = None


def run_inprocess(methods: list[Method], prompts: list[dict], *, target: str | None, max_new_tokens: int,
                  threads: int | None, dtypes: tuple[str, ...] = ("auto",)) -> dict[str, Any]:
    """Every method in every target dtype, round-robin per prompt; speedups against the same dtype's baseline
    and against the first dtype's baseline."""
    import torch
    from tqdm import tqdm

    from engine.algos.loading import make_proposer
    from engine.generate.kernel_choice import load_decode_target
    from engine.generate.metrics import SpecMetrics
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate
    from engine.targets.dtypes import dtype_name

    if threads:
        torch.set_num_threads(threads)
    models: dict[str, Any] = {}
    for choice in dtypes:  # each on the engine's measured kernel path; "auto,bf16" may be one dtype
        loaded = load_decode_target(target, choice)
        models.setdefault(dtype_name(loaded.dtype), loaded)
    names = list(models)
    first = models[names[0]]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    if first.tokenizer.eos_token_id is not None:
        params.eos_token_ids = [first.tokenizer.eos_token_id]
    columns = [(d, m, m.name if len(names) == 1 else f"{m.name} ({d})") for d in names for m in methods]
    proposers = {col: make_proposer(m.kind, models[d], draft=m.draft)
                 for d, m, col in columns}
    runners = {col: TargetRunner(models[d], getattr(proposers[col], "aux_layer_ids", None)) for d, m, col in columns}
    tallies = {col: Tally(metrics=SpecMetrics()) for _, _, col in columns}
    encoded = [prompt_ids(first.tokenizer, p) for p in prompts]
    warm = replace(params, max_new_tokens=min(8, max_new_tokens))
    for _, m, col in columns:  # untimed: the first calls (oneDNN's primitives, caches) would land on one method
        for _ in generate(runners[col], encoded[0], warm, proposers[col], m.k):
            pass
    for ids in tqdm(encoded, desc="in-process"):
        for _, m, col in columns:
            t, run = tallies[col], SpecMetrics()
            out: list[int] = []
            for event in generate(runners[col], ids, params, proposers[col], m.k):
                run.observe(event)
                out.extend(event.tokens)
                t.draft_s += event.draft_s
                t.target_s += event.target_s
                t.steps += 1
            t.metrics.merge(run)
            t.seconds += run.total_seconds
            t.tokens += len(out)
            t.outputs.append(out)
    bases = {d: tallies[col] for d, m, col in columns if m.kind == "baseline"}
    base_ms = {d: 1e3 * b.seconds / max(1, b.steps) for d, b in bases.items()}
    rows = {}
    for d, m, col in columns:
        t, base, ref = tallies[col], bases.get(d), bases.get(names[0])
        tps = t.tokens / t.seconds if t.seconds else 0.0
        draft_ms = 1e3 * t.draft_s / max(1, t.steps) if m.kind != "baseline" else None
        rows[col] = {
            "dtype": d, "k": m.k if m.kind != "baseline" else None, "draft": m.draft,
            "mean_acceptance_length": t.metrics.mean_acceptance_length if m.kind != "baseline" else None,
            "per_position_acceptance": t.metrics.per_position_acceptance if m.kind != "baseline" else [],
            "draft_ms_per_step": draft_ms,
            "draft_fraction_of_target_step": draft_ms / base_ms[d] if draft_ms is not None and d in base_ms else None,
            "step_ms": 1e3 * t.seconds / max(1, t.steps),
            "tokens": t.tokens, "seconds": t.seconds, "tokens_per_s": tps,
            "speedup": tps / (base.tokens / base.seconds) if base and base.seconds else None,
            f"speedup_vs_{names[0]}_baseline": tps / (ref.tokens / ref.seconds) if ref and ref.seconds else None,
            "identical_to_baseline": t.outputs == base.outputs if base else None,
        }
    return {"backend": "transformers", "threads": torch.get_num_threads(), "dtypes": names,
            "kernel_paths": {d: m.extra.get("kernel_summary") for d, m in models.items()},
            "baseline_step_ms": base_ms[names[0]], "baseline_step_ms_by_dtype": base_ms, "methods": rows}


def run_vllm(methods: list[Method], prompts: list[dict], *, target: str | None, max_new_tokens: int) -> dict:
    """One server per method through the managed vLLM; every speedup against the one baseline run."""
    from engine.measure.options import BenchOptions
    from engine.measure.vllm_bench import run_vllm_bench
    from engine.serve.server import ServerPool

    pool = ServerPool()
    rows: dict[str, Any] = {}
    base_outputs, base_tps = None, None
    try:
        for m in methods:
            kind = {"baseline": "baseline", "ngram": "ngram"}.get(m.kind, "draft")
            options = BenchOptions(target=target, draft=m.draft, methods=kind, max_new_tokens=max_new_tokens,
                                   **({"k": m.k} if m.k else {}))
            res = run_vllm_bench(prompts, options, tokenize=True, pool=pool)
            row = res["methods"][kind]
            pool.close()  # one server at a time: they share the 2 cores and the memory
            if kind == "baseline":
                base_outputs, base_tps = row["outputs"], row["tokens_per_s"]
            rows[m.name] = {
                "k": m.k if kind != "baseline" else None, "draft": m.draft,
                "mean_acceptance_length": row.get("mean_acceptance_length"),
                "per_position_acceptance": row.get("per_position_acceptance") or [],
                "tokens_per_s": row["tokens_per_s"],
                "speedup": row["tokens_per_s"] / base_tps if base_tps else None,
                "identical_to_baseline": row["outputs"] == base_outputs if base_outputs is not None else None,
                "server_start_s": row.get("server_start_s"),
                "tokens": row.get("completion_tokens"),
            }
    finally:
        pool.close()
    return {"backend": "vllm", "dtype": "bfloat16", "methods": rows}


def markdown(result: dict[str, Any]) -> str:
    """Both tables, as the dated history (docs/benchmarks-history.md) shows them."""
    lines = []
    ip = result.get("inprocess")
    if ip:
        lines += ["| method | k | mean acceptance length | per-position acceptance | draft ms / step | "
                  "draft / target step | tokens/s | speedup | identical |", "|---|---|---|---|---|---|---|---|---|"]
        dtypes = ip.get("dtypes") or ["fp32"]
        ref = f"speedup_vs_{dtypes[0]}_baseline"
        if len(dtypes) > 1:
            lines[0] += f" vs {dtypes[0]} baseline |"
            lines[1] += "---|"
        for name, r in ip["methods"].items():
            lines.append(
                f"| {name} | {r['k'] or '–'} | {_f(r['mean_acceptance_length'])} | "
                f"{', '.join(f'{x:.2f}' for x in r['per_position_acceptance']) or '–'} | "
                f"{_f(r['draft_ms_per_step'], 1)} | {_f(r['draft_fraction_of_target_step'])} | "
                f"{r['tokens_per_s']:.1f} | {_f(r['speedup'])}× | {_yes(r['identical_to_baseline'])} |"
                + (f" {_f(r.get(ref))}× |" if len(dtypes) > 1 else ""))
        steps = ip.get("baseline_step_ms_by_dtype") or {dtypes[0]: ip["baseline_step_ms"]}
        lines.append("\nBaseline target step " + ", ".join(f"{ms:.1f} ms ({d})" for d, ms in steps.items())
                     + f", {ip['threads']} threads.")
    vl = result.get("vllm")
    if vl:
        lines += ["", "| method | k | mean acceptance length | per-position acceptance | tokens/s | speedup | "
                  "identical | server start |", "|---|---|---|---|---|---|---|---|"]
        for name, r in vl["methods"].items():
            lines.append(
                f"| {name} | {r['k'] or '–'} | {_f(r['mean_acceptance_length'])} | "
                f"{', '.join(f'{x:.2f}' for x in r['per_position_acceptance']) or '–'} | {r['tokens_per_s']:.1f} | "
                f"{_f(r['speedup'])}× | {_yes(r['identical_to_baseline'])} | {_f(r['server_start_s'], 0)} s |")
    return "\n".join(lines)


def _f(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _yes(x) -> str:
    return "–" if x is None else ("yes" if x else "no")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", action="append", required=True,
                    help="NAME=DRAFT_FOLDER@K, ngram@K (repeatable; the baseline is always run first)")
    ap.add_argument("--vllm-method", action="append", default=None,
                    help="methods for the vLLM part when they differ (default: the same --method list)")
    ap.add_argument("--target", default=None)
    ap.add_argument("--prompts", default="sharegpt")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default="auto",
                    help="in-process target dtypes, comma-separated (auto, bf16, fp32): each gets its own baseline")
    ap.add_argument("--vllm", action="store_true", help="also run the same prompts in real vLLM")
    ap.add_argument("--no-inprocess", action="store_true", help="only the vLLM part")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from engine.data.prompts.load import load_prompts

    methods = [parse_method("baseline")] + [parse_method(s) for s in args.method if s != "baseline"]
    prompts = load_prompts(args.prompts, args.num_prompts, 0, 1500)
    started = time.time()
    result: dict[str, Any] = {"num_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                              "prompts": args.prompts, "command": command_line("bench_drafters.py", argv)}
    if not args.no_inprocess:
        result["inprocess"] = run_inprocess(methods, prompts, target=args.target,
                                            max_new_tokens=args.max_new_tokens, threads=args.threads,
                                            dtypes=tuple(d.strip() for d in args.dtype.split(",") if d.strip()))
    if args.vllm:
        vmethods = methods if not args.vllm_method else \
            [parse_method("baseline")] + [parse_method(s) for s in args.vllm_method if s != "baseline"]
        result["vllm"] = run_vllm(vmethods, prompts, target=args.target, max_new_tokens=args.max_new_tokens)
    result["seconds"] = time.time() - started
    dtypes = list((result.get("inprocess") or {}).get("dtypes") or []) + (["bfloat16"] if args.vllm else [])
    print_and_save(result, markdown(result), args.json, dtype=dtypes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
