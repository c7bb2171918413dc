"""Benchmark speculative methods against the baseline on the same prompts, interleaved in one run.

Methods: `baseline` (our KV-cached loop), `draft` (ours with a draft), `ngram` (ours, prompt lookup),
`hf_prompt_lookup` (transformers `generate(prompt_lookup_num_tokens=k)`) and `hf_assisted`
(transformers assisted generation with a small assistant model, when one is given).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.algos.loading import make_proposer
from engine.algos.shipped import default_draft
from engine.data.prompts.load import load_prompts
from engine.format.checkpoint import weights_sha256
from engine.generate.kernel_choice import load_decode_target
from engine.generate.metrics import SpecMetrics, measure_cost_curve, speedup_ceiling
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate
from engine.jobs import reporter, tracked
from engine.measure.llamacpp_bench import run_llamacpp_bench
from engine.measure.options import BenchOptions
from engine.measure.speed import speed_per_k
from engine.measure.vllm_bench import run_vllm_bench
from engine.provenance import provenance
from engine.targets.dtypes import dtype_name
from engine.targets.identity import target_for_draft
from engine.targets.loading import load_target
from engine.targets.resolve import resolve_target

log = logging.getLogger(__name__)


@dataclass
class MethodRun:
    name: str
    metrics: SpecMetrics = field(default_factory=SpecMetrics)
    outputs: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0
    steps: int = 0
    skipped: str | None = None
    per_prompt: list[dict[str, Any]] = field(default_factory=list)  # tokens, seconds, acceptance of each prompt


class _HFMethods:
    """transformers' own speculative modes through `model.generate`."""

    def __init__(self, target, k: int, assistant: str | None):
        self.target, self.k = target, k
        self.assistant = None
        if assistant:
            self.assistant = load_target(assistant).model

    def run(self, method: str, ids: list[int], params: SamplingParams) -> tuple[list[int], float]:
        kwargs: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, do_sample=not params.greedy,
                                      pad_token_id=params.eos_token_ids[0] if params.eos_token_ids else None,
                                      eos_token_id=params.eos_token_ids or None)
        if not params.greedy:
            kwargs.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
        if method == "hf_prompt_lookup":
            kwargs["prompt_lookup_num_tokens"] = self.k
        else:
            kwargs.update(assistant_model=self.assistant, num_assistant_tokens=self.k,
                          num_assistant_tokens_schedule="constant")
        if params.seed is not None:
            torch.manual_seed(params.seed)
        x = torch.tensor([ids], device=self.target.device)
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
        return out[0, len(ids):].tolist(), time.perf_counter() - t


def run_bench(target, prompts: list[dict[str, Any]], options: BenchOptions, *, measure_cost: bool = True,
              progress: bool = True, span: tuple[float, float] | None = None) -> dict[str, Any]:
    """Run every method of `options` on every prompt (round-robin per prompt) with a loaded `target` and summarise
    like vLLM; with `span`, the job's progress (prompts done, time left) goes into its status.json within that part
    of the job."""
    methods, draft, k = options.method_names(), options.draft, options.k
    params = options.sampling()
    if not params.eos_token_ids and target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        params.eos_token_ids = [target.tokenizer.eos_token_id]
    runs = {m: MethodRun(m) for m in methods}
    proposers = {}
    for m in methods:
        if m in ("draft", "ngram", "draft_ngram"):
            proposers[m] = make_proposer(m, target, draft=draft, p_min=options.p_min,
                                         ngram_min_match=options.ngram_min_match)
    hf = _HFMethods(target, k, options.assistant) if {"hf_prompt_lookup", "hf_assisted"} & set(methods) else None
    if "hf_assisted" in methods and (hf is None or hf.assistant is None):
        runs["hf_assisted"].skipped = "no assistant model fits this target (pass --assistant DIR: a small causal LM " \
                                      "with the same tokenizer)"
    runners = {m: TargetRunner(target, getattr(proposers.get(m), "aux_layer_ids", None)) for m in methods}
    encoded = [prompt_ids(target.tokenizer, p) for p in prompts]
    size = len(encoded) * params.max_new_tokens * len(methods)  # what its time scales with, for later estimates
    for ids in tracked(encoded, desc="prompts benchmarked (every method)", span=span, unit="prompt",
                       enabled=progress, units=size):
        for m in methods:
            run = runs[m]
            if run.skipped:
                continue
            if m.startswith("hf_"):
                out, seconds = hf.run(m, ids, params)
                run.outputs.append(out)
                run.seconds += seconds
                run.metrics.num_tokens += len(out)
                run.metrics.total_seconds += seconds
                run.per_prompt.append({"tokens": len(out), "seconds": round(seconds, 4)})
                continue
            m_run = SpecMetrics()
            out: list[int] = []
            for event in generate(runners[m], ids, params, proposers.get(m), k):
                m_run.observe(event)
                out.extend(event.tokens)
                run.target_s += event.target_s
                run.draft_s += event.draft_s
                run.steps += 1
            run.metrics.merge(m_run)
            run.seconds += m_run.total_seconds
            run.outputs.append(out)
            tau = m_run.mean_acceptance_length
            run.per_prompt.append({"tokens": len(out), "seconds": round(m_run.total_seconds, 4),
                                   "num_drafts": m_run.num_drafts, "num_accepted_tokens": m_run.num_accepted_tokens,
                                   "mean_acceptance_length": round(tau, 4) if tau is not None else None,
                                   "per_position_acceptance": [round(x, 4) for x in m_run.per_position_acceptance]})
    curve = measure_cost_curve(runners["baseline"] if "baseline" in runners else TargetRunner(target),
                               encoded[0] * max(1, 256 // max(1, len(encoded[0]))), [k + 1]) if measure_cost else {}
    result = summarize(runs, k=k, params=params, cost_curve=curve, num_prompts=len(prompts), target=target,
                       draft=draft)
    result["prompt_previews"] = [_preview(p) for p in prompts]
    return result


def _preview(prompt: dict[str, Any], width: int = 120) -> str:
    """The last user message of a bench prompt, on one line, cut to `width` characters (for per-prompt tables)."""
    text = prompt.get("prompt")
    if text is None:
        users = [m.get("content", "") for m in prompt.get("messages") or [] if m.get("role") == "user"]
        text = users[-1] if users else ""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def summarize(runs: dict[str, MethodRun], *, k: int, params: SamplingParams, cost_curve: dict[int, float],
              num_prompts: int, target, draft) -> dict[str, Any]:
    base = runs.get("baseline")
    base_tps = base.metrics.tokens_per_s if base and not base.skipped else None
    verify_cost = cost_curve.get(k + 1)
    methods: dict[str, Any] = {}
    for name, run in runs.items():
        if run.skipped:
            methods[name] = {"skipped": run.skipped, "mean_acceptance_length": None, "per_position_acceptance": [],
                             "tokens_per_s": 0.0, "speedup": 0.0, "identical_to_baseline": False}
            continue
        m = run.metrics
        tau = m.mean_acceptance_length
        row = {
            "mean_acceptance_length": tau,
            "per_position_acceptance": m.per_position_acceptance,
            "acceptance_rate": m.acceptance_rate,
            "num_drafts": m.num_drafts, "num_draft_tokens": m.num_draft_tokens,
            "num_accepted_tokens": m.num_accepted_tokens,
            "accepted_per_pos": m.accepted_per_pos, "drafted_per_pos": m.drafted_per_pos,
            "tokens": m.num_tokens, "seconds": run.seconds,
            "tokens_per_s": m.tokens_per_s,
            "speedup": m.tokens_per_s / base_tps if base_tps else None,
            "identical_to_baseline": bool(base and not base.skipped and run.outputs == base.outputs),
            "per_prompt": run.per_prompt,
        }
        if run.steps:
            overhead = max(0.0, run.seconds - run.target_s - run.draft_s)
            row["overhead_fraction"] = overhead / run.seconds if run.seconds else None
            row["draft_fraction"] = run.draft_s / run.seconds if run.seconds else None
        if name in ("draft", "ngram") and verify_cost:
            row["speedup_ceiling"] = speedup_ceiling(m.decode_tokens, m.decode_steps, m.num_drafts, verify_cost)
        methods[name] = row
    return {
        "methods": methods,
        "k": k, "num_prompts": num_prompts, "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature, "seed": params.seed,
        "target": target.ref.name, "draft": str(draft) if draft else None,
        "cost_curve": {str(kk): v for kk, v in cost_curve.items()},
        "backend": "transformers", "target_dtype": dtype_name(target.dtype), "kernel": target.extra.get("kernel"),
        "device": str(target.device), "threads": torch.get_num_threads(),
        **provenance(dtype_name(target.dtype), on_cpu=target.device.type == "cpu"),
    }


def markdown_table(result: dict[str, Any]) -> str:
    lines = ["| method | mean acceptance length | per-position acceptance | tokens/s | speedup | identical |",
             "|---|---|---|---|---|---|"]
    for name, row in result["methods"].items():
        if row.get("skipped"):
            lines.append(f"| {name} | skipped: {row['skipped']} | | | | |")
            continue
        tau = f"{row['mean_acceptance_length']:.2f}" if row["mean_acceptance_length"] is not None else "–"
        pos = ", ".join(f"{x:.2f}" for x in row["per_position_acceptance"]) or "–"
        ci = (row.get("spread") or {}).get("ci95")
        sp = (f"{row['speedup']:.2f}×" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "")
              if row.get("speedup") is not None else "–")
        lines.append(f"| {name} | {tau} | {pos} | {row['tokens_per_s']:.1f} | {sp} | "
                     f"{'yes' if row['identical_to_baseline'] else 'no'} |")
    kernel = result.get("kernel") or {}
    if kernel.get("path"):
        exact = (kernel.get("candidates") or {}).get(kernel["path"], {}).get("row_exact")
        lines.append("")
        lines.append(f"Kernel path {kernel['path']} ({kernel.get('mode', 'auto')}): " + (
            "row exactness not checked here" if exact is None else
            "bit-identical, so 'identical' must read yes for greedy decoding" if exact else
            "lossless in distribution, not bit-identical: 'identical' compares outputs, which may differ at near-ties"))
    curve = result.get("cost_curve") or {}
    if curve:
        lines.append("")
        lines.append("Target cost of one forward over k+1 tokens vs 1: " +
                     ", ".join(f"{kk} tokens: {v:.2f}×" for kk, v in curve.items()))
    for name, row in result["methods"].items():
        if row.get("speedup_ceiling"):
            lines.append(f"{name}: speedup ceiling (free drafting) {row['speedup_ceiling']:.2f}×, "
                         f"overhead {100 * (row.get('overhead_fraction') or 0):.1f}% of step time, "
                         f"drafting {100 * (row.get('draft_fraction') or 0):.1f}%")
    return "\n".join(lines)


def benchmark(options: BenchOptions, *, span: tuple[float, float] | None = None) -> dict:
    """`python -m engine bench` as a function: in-process (`transformers`) or real vLLM (`vllm`) on the same prompts."""
    o = options
    if o.threads:
        torch.set_num_threads(o.threads)
    methods, target, draft = o.method_names(), o.target, o.draft
    if draft is not None and "draft" in methods:
        target = target_for_draft(draft, target)  # the draft's verifier, or a target of its shape
    prompt_rows = load_prompts(o.prompts, o.num_prompts, o.seed, o.max_prompt_chars)
    reporter().update(f"benchmarking {len(prompt_rows)} prompts", 0.0)
    if o.backend == "vllm":
        draft = draft or default_draft(target)
        served = o.model_copy(update={"target": target, "draft": str(draft) if draft else None})
        result = run_vllm_bench(prompt_rows, served, tokenize=True)
    elif o.backend == "llama.cpp":
        result = _llamacpp(o, target, draft, prompt_rows)
    elif o.ks:
        result = speed_per_k(load_decode_target(target, o.dtype), prompt_rows, o.model_copy(update={"target": target}))
    else:
        options = o.model_copy(update={"target": target})
        result = run_bench(load_decode_target(target, o.dtype), prompt_rows, options, span=span)
    return {**result, **_weights_of(draft if "draft" in methods else None)}


def _llamacpp(o: BenchOptions, target: str | None, draft: str | None, prompt_rows: list[dict[str, Any]]) -> dict:
    """`bench --backend llama.cpp`: the prompts tokenized as in-process, the draft (default: the shipped one)
    exported for llama.cpp, every llama.cpp method on its own server."""
    from transformers import AutoTokenizer


    if any(m.startswith("draft") for m in o.method_names()):
        draft = draft or (str(default_draft(target)) if default_draft(target) else None)
    target_dir = resolve_target(target).path
    tok = AutoTokenizer.from_pretrained(target_dir)
    ids = [prompt_ids(tok, p) for p in prompt_rows]
    rep = reporter()
    return run_llamacpp_bench(ids, o, target_dir=target_dir, draft=draft,
                              progress=lambda message, fraction: rep.update(message, fraction))


def _weights_of(draft: str | None) -> dict[str, str]:
    """{"draft_sha256": ...} for a draft folder: the weights measured, beyond the folder's name."""
    return {"draft_sha256": weights_sha256(draft)} if draft and Path(draft).is_dir() else {}
