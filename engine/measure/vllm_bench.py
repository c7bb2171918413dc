"""Benchmark speculative methods on real vLLM: the same prompts, one at a time, per method; speed and acceptance.

`run_vllm_bench` is the `--backend vllm` half of `python -m engine bench`: each method gets its own server
(baseline = the target alone, draft = the target with the draft through `--speculative-config`, ngram =
vLLM's prompt-lookup proposer), and acceptance comes from the deltas of vLLM's own /metrics counters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError
from engine.generate.prompt import prompt_ids
from engine.measure.options import BenchOptions
from engine.provenance import provenance
from engine.serve.metrics import scrape, spec_delta
from engine.serve.server import ServePlan, ServerPool, plan_server
from engine.targets.dtypes import vllm_dtype
from engine.targets.identity import target_for_draft

log = logging.getLogger(__name__)

METHODS = ("baseline", "draft", "ngram")
NGRAM_LOOKUP = {"prompt_lookup_max": 5, "prompt_lookup_min": 2}
DEFAULT_K = 3


def method_plan(method: str, *, target: str | None, draft: str | Path | None, k: int | None,
                validate: bool = True) -> ServePlan:
    """The server plan of one benchmark method."""
    if method == "baseline":
        return plan_server(target=target)
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": int(k or DEFAULT_K), **NGRAM_LOOKUP}
        return plan_server(target=target, speculative_config=spec)
    if method == "draft":
        if draft is None:
            raise WorkbenchError("the 'draft' method needs a draft folder and this target ships none",
                                 hint="pass a draft folder (draft=...), or leave 'draft' out of methods")
        return plan_server(draft, target=target, k=k, form="explicit", validate=validate)
    raise WorkbenchError(f"unknown method '{method}'", hint=f"choose from {list(METHODS)}")


def _default_draft(target: str | None) -> Path | None:
    try:
        from engine.algos.shipped import default_draft
    except ImportError:
        return None
    return default_draft(target)


def _token_prompts(prompts: Sequence[dict[str, Any]], target_path: str) -> list[dict[str, Any]]:
    """Prompts as token ids, tokenized exactly as the in-process engine does (chat template included)."""
    from transformers import AutoTokenizer


    tok = AutoTokenizer.from_pretrained(target_path)
    return [{"prompt": prompt_ids(tok, item)} for item in prompts]


def _generate_all(server, prompts: Sequence[dict[str, Any]], *, max_new_tokens: int, temperature: float,
                  seed: int | None) -> dict[str, Any]:
    client = server.client()
    client.complete("Hello", max_tokens=4)  # warm-up: first-request costs stay out of the timing
    first = before = scrape(server.url)
    outputs, token_ids, tokens, seconds, per_prompt = [], [], 0, 0.0, []
    for i, item in enumerate(prompts):
        result = client.generate(item, max_tokens=max_new_tokens, temperature=temperature,
                                 seed=None if seed is None else seed + i)
        outputs.append(result.text)
        token_ids.append(result.token_ids)
        tokens += result.completion_tokens
        seconds += result.seconds
        after = scrape(server.url)  # one request at a time: the counters' delta is this prompt's (outside the timing)
        mine = spec_delta(before, after)
        per_prompt.append({"tokens": result.completion_tokens, "seconds": round(result.seconds, 4),
                           "num_drafts": mine["num_drafts"], "num_accepted_tokens": mine["num_accepted_tokens"],
                           "mean_acceptance_length": mine["mean_acceptance_length"],
                           "per_position_acceptance": mine["per_position_acceptance"]})
        before = after
    delta = spec_delta(first, before)
    return {"outputs": outputs, "token_ids": token_ids, "completion_tokens": tokens, "seconds": seconds,
            "per_prompt": per_prompt,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0, "metrics": delta,
            "memory_bytes": server.memory_bytes()}


def _first_divergence(a: list[int] | None, b: list[int] | None, text_a: str, text_b: str) -> int | None:
    """Index of the first differing token (or character, without ids); None when identical."""
    x, y = (a, b) if a is not None and b is not None else (text_a, text_b)
    for i, (p, q) in enumerate(zip(x, y, strict=False)):  # the outputs' lengths may differ
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def run_vllm_bench(prompts: Sequence[dict[str, Any]], options: BenchOptions, *, tokenize: bool = False,
                   validate: bool = True, pool: ServerPool | None = None,
                   progress: Callable[[str, float], None] | None = None) -> dict[str, Any]:
    """`run_bench` on vLLM: each of the options' vLLM methods (baseline, draft, ngram) on its server (started here,
    or taken from `pool`), compared.

    `prompts`: {"prompt": str} or {"messages": [...]} items, sent as token ids tokenized as in-process with
    `tokenize`. Returns {"methods": {name: {"mean_acceptance_length", "per_position_acceptance", "tokens_per_s",
    "speedup", "identical_to_baseline", "outputs", ...}}, "backend": "vllm", ...}. bf16 greedy outputs may drift
    from the baseline (batched verification rounds differently); fp32 is exact.
    """
    if not prompts:
        raise WorkbenchError("no prompts to benchmark", hint="give at least one {'prompt': ...} item")
    o, asked = options, options.method_names()
    methods = [m for m in METHODS if m in asked]
    if not methods:
        raise WorkbenchError(f"vLLM runs none of the methods {list(asked)}",
                             hint=f"choose from {list(METHODS)} (the others run in-process only)")
    target, dtype = o.target, vllm_dtype(o.dtype)
    draft = o.draft if o.draft is not None else (_default_draft(target) if "draft" in methods else None)
    if draft is not None:  # every method runs on the draft's verifier (or a --target that agrees with it)
        target = target_for_draft(draft, target)
    k = o.k if methods != ["baseline"] else None
    report = progress or (lambda message, fraction: None)
    own_pool = pool is None
    pool = pool or ServerPool()
    plans = {m: method_plan(m, target=target, draft=draft, k=k, validate=validate) for m in methods}
    items = _token_prompts(prompts, plans[methods[0]].target) if tokenize else list(prompts)
    runs: dict[str, dict[str, Any]] = {}
    started = time.time()
    try:
        for n, method in enumerate(methods):
            report(f"vLLM bench: starting the {method} server", n / len(methods))
            t0 = time.time()
            server = pool.get(plans[method], dtype=dtype)
            start_s = time.time() - t0
            report(f"vLLM bench: {method}, {len(items)} prompts", (n + 0.5) / len(methods))
            runs[method] = {**_generate_all(server, items, max_new_tokens=o.max_new_tokens, temperature=o.temperature,
                                            seed=o.seed), "server_start_s": round(start_s, 1),
                            "speculative_config": plans[method].speculative_config}
            log.info("vLLM bench %s: %.1f tokens/s", method, runs[method]["tokens_per_s"])
    finally:
        if own_pool:
            pool.close()
    report("vLLM bench done", 1.0)
    return _result(runs, draft=draft, target=plans[methods[0]].target, k=k, max_new_tokens=o.max_new_tokens,
                   temperature=o.temperature, seed=o.seed, dtype=dtype, prompts=len(items),
                   seconds=time.time() - started)


def _result(runs: dict[str, dict[str, Any]], **facts: Any) -> dict[str, Any]:
    base = runs.get("baseline")
    out: dict[str, Any] = {}
    for method, run in runs.items():
        m = run["metrics"]
        speculative = method != "baseline"
        divergence = None if not base else [
            _first_divergence(a, b, ta, tb)
            for a, b, ta, tb in zip(run["token_ids"], base["token_ids"], run["outputs"], base["outputs"], strict=True)]
        out[method] = {
            "mean_acceptance_length": m["mean_acceptance_length"] if speculative else None,
            "per_position_acceptance": m["per_position_acceptance"] if speculative else [],
            "tokens_per_s": run["tokens_per_s"],
            "speedup": run["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None,
            "identical_to_baseline": all(d is None for d in divergence) if divergence is not None else None,
            "outputs": run["outputs"],
            "per_prompt": run["per_prompt"],
            "first_divergence": divergence,
            "acceptance_rate": m["acceptance_rate"] if speculative else None,
            "num_drafts": m["num_drafts"],
            "num_draft_tokens": m["num_draft_tokens"],
            "num_accepted_tokens": m["num_accepted_tokens"],
            "completion_tokens": run["completion_tokens"],
            "seconds": run["seconds"],
            "server_start_s": run["server_start_s"],
            "memory_bytes": run["memory_bytes"],
            "speculative_config": run["speculative_config"],
        }
    facts["draft"] = str(facts["draft"]) if facts.get("draft") is not None else None
    return {"methods": out, "backend": "vllm", **facts, **_machine(str(facts.get("dtype")))}


def _machine(dtype: str) -> dict[str, Any]:
    """Where the servers ran, for the record: the CPU with vLLM's CPU build (None with its CUDA build), the dtype,
    the day, and the torch (and vLLM) of vLLM's own environment."""
    from engine.serve.venv import read_stamp

    env = read_stamp()
    versions = {"torch_version": env.torch_version} if env is not None else {}
    return {**provenance(dtype, on_cpu=env is None or env.flavor == "cpu", **versions),
            "vllm_flavor": env and env.flavor, "vllm_version": env and env.vllm_version}
