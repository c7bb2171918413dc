"""Benchmark speculative methods in real llama.cpp: the same prompts, interleaved prompt by prompt over live servers."""

# `run_llamacpp_bench` is the `--backend llama.cpp` half of `python -m engine bench`. Each method has its own
# llama-server (baseline: the target alone; draft: with the exported draft; ngram: llama.cpp's `ngram-simple`;
# draft_ngram: the draft mixed with `ngram-mod`), all started first, then every prompt goes to each in turn, so a busy
# neighbour slows all methods alike. Prompts are token ids tokenized as in-process; acceptance is llama.cpp's own
# (`draft_n`, `draft_n_accepted` per request, verification steps from `/metrics`).

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError
from engine.llamacpp.build import ensure_llamacpp
from engine.llamacpp.gguf import DraftGguf, export_draft, target_gguf
from engine.llamacpp.server import LlamaAnswer, LlamaPlan, LlamaServer
from engine.measure.options import BenchOptions
from engine.measure.spread import acceptance_spread, mean_interval
from engine.provenance import provenance

log = logging.getLogger(__name__)

METHODS = ("baseline", "draft", "ngram", "draft_ngram")
NGRAM_TYPE = "ngram-simple"  # llama.cpp's prompt lookup: the last n-gram's earlier continuation
NGRAM_N = 2  # its lookup length, as short as the in-process n-gram's shortest (its defaults, 12 and 48, seldom draft)
MIX_TYPE = "ngram-mod"  # the n-gram proposer llama.cpp mixes with a draft (its docs' example), at its own defaults


def ngram_args(k: int) -> tuple[str, ...]:
    """ngram-simple drafting k tokens after a match of NGRAM_N (at most k: it needs m >= n)."""
    return ("--spec-ngram-simple-size-n", str(min(NGRAM_N, k)), "--spec-ngram-simple-size-m", str(k))


def method_plan(method: str, *, target: Path, draft: DraftGguf | None, k: int, p_min: float | None) -> LlamaPlan:
    """The llama-server plan of one benchmark method."""
    if method == "baseline":
        return LlamaPlan(target)
    if method == "ngram":
        return LlamaPlan(target, spec_types=(NGRAM_TYPE,), k=k, extra_args=ngram_args(k))
    if draft is None:
        raise WorkbenchError(f"the '{method}' method needs a draft and this target ships none",
                             hint="pass --draft DIR, or leave the draft methods out of --methods")
    types = (draft.spec_type, MIX_TYPE) if method == "draft_ngram" else (draft.spec_type,)
    return LlamaPlan(target, draft.path, types, k=k, p_min=p_min, draft=str(draft.draft))


def run_llamacpp_bench(prompts: Sequence[list[int]], options: BenchOptions, *, target_dir: str,
                       draft: str | None, progress: Callable[[str, float], None] | None = None,
                       workdir: Path | None = None) -> dict[str, Any]:
    """Every method of `options` that llama.cpp runs, on token-id `prompts`, interleaved; the summary as vLLM's."""
    o = options
    methods = [m for m in METHODS if m in o.method_names()]
    if not methods:
        raise WorkbenchError(f"llama.cpp runs none of the methods {list(o.method_names())}",
                             hint=f"choose from {list(METHODS)}")
    report = progress or (lambda message, fraction: None)
    build = ensure_llamacpp(report)
    tgt = target_gguf(target_dir, outtype=o.gguf_target, build=build, progress=report)
    needs_draft = any(m.startswith("draft") for m in methods)
    exported = export_draft(draft, target=target_dir, outtype=o.gguf_draft, build=build, progress=report) \
        if needs_draft and draft else None
    plans = {m: method_plan(m, target=tgt, draft=exported, k=o.k, p_min=o.p_min) for m in methods}
    servers = {m: LlamaServer(p, threads=o.threads, build=build, workdir=(workdir / m) if workdir else None)
               for m, p in plans.items()}
    answers: dict[str, list[LlamaAnswer]] = {m: [] for m in methods}
    started = time.time()
    try:
        for m, server in servers.items():
            report(f"llama.cpp bench: starting the {m} server", 0.1)
            server.start().wait_ready()
            server.client().complete(prompts[0][:8], max_tokens=4, counters=False)  # warm-up, untimed
        for i, ids in enumerate(prompts):
            for m in methods:
                answers[m].append(servers[m].client().complete(ids, max_tokens=o.max_new_tokens,
                                                               temperature=o.temperature, seed=o.seed + i))
            report(f"llama.cpp bench: {i + 1}/{len(prompts)} prompts", 0.1 + 0.9 * (i + 1) / len(prompts))
        if "baseline" in servers:
            gaps = divergence_gaps(servers["baseline"].client(), prompts, answers)
    finally:
        for server in servers.values():
            server.stop()
    facts = {"k": o.k, "p_min": o.p_min, "max_new_tokens": o.max_new_tokens, "temperature": o.temperature,
             "seed": o.seed, "num_prompts": len(prompts), "draft": draft, "target": target_dir,
             "target_gguf": tgt.name, "gguf_target": o.gguf_target, "gguf_draft": o.gguf_draft if exported else None,
             "spec_type": exported.spec_type if exported else None, "threads": servers[methods[0]].threads,
             "llama_cpp_version": build.version, "seconds": round(time.time() - started, 1),
             "llama_server": {m: s.command_line() for m, s in servers.items()}}
    out = summarize(answers, facts)
    for method, found in (gaps if "baseline" in servers else {}).items():
        out["methods"][method]["divergence_gaps"] = found
    return out


def divergence_gaps(client, prompts: Sequence[list[int]], answers: dict[str, list[LlamaAnswer]]
                    ) -> dict[str, list[float | None]]:
    """Per method and prompt where the answer left the baseline's: how far apart the two tokens were there, as the
    baseline's log-probability of its own token less that of the method's (a near-tie: about 0). None: no divergence,
    or the method's token is not among the baseline's two likeliest."""
    out: dict[str, list[float | None]] = {}
    base = answers["baseline"]
    for method, rows in answers.items():
        if method == "baseline":
            continue
        gaps = []
        for ids, a, b in zip(prompts, rows, base, strict=True):
            i = _first_divergence(a.token_ids, b.token_ids)
            if i is None or i >= min(len(a.token_ids), len(b.token_ids)):
                gaps.append(None)
                continue
            top = client.top_logprobs(list(ids) + b.token_ids[:i], n=2)
            mine, theirs = top.get(b.token_ids[i]), top.get(a.token_ids[i])
            gaps.append(round(mine - theirs, 6) if mine is not None and theirs is not None else None)
        out[method] = gaps
    return out


def summarize(answers: dict[str, list[LlamaAnswer]], facts: dict[str, Any]) -> dict[str, Any]:
    """Per method: llama.cpp's generation rate (tokens/s, the prompt's pass left out; whole requests beside it),
    speedup and its spread over prompts, identity, acceptance."""
    base = answers.get("baseline")
    out: dict[str, Any] = {}
    for method, rows in answers.items():
        tokens, seconds = sum(a.tokens for a in rows), sum(a.seconds for a in rows)
        steps, accepted, drafted = (sum(getattr(a, f) for a in rows) for f in ("draft_steps", "draft_accepted",
                                                                              "draft_n"))
        speculative = method != "baseline"
        spread = acceptance_spread([1 + a.draft_accepted / a.draft_steps if a.draft_steps else None for a in rows],
                                   [a.draft_steps for a in rows]) if speculative else {}
        out[method] = {
            "mean_acceptance_length": (1 + accepted / steps if steps else None) if speculative else None,
            "acceptance_spread": spread or None,
            "per_position_acceptance": [],  # llama.cpp counts it only in its trace log
            "acceptance_rate": accepted / drafted if drafted else None,
            "num_drafts": steps, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "tokens": tokens, "seconds": round(seconds, 4),
            "tokens_per_s": _decode_rate(rows),  # llama.cpp's own generation rate, the prompt's pass left out
            "whole_tokens_per_s": tokens / seconds if seconds else 0.0,  # whole requests, prompt included
            "speedup": None, "spread": None,
            "identical_to_baseline": all(a.token_ids == b.token_ids for a, b in zip(rows, base, strict=True))
            if base else None,
            "identical_prompts": sum(a.token_ids == b.token_ids for a, b in zip(rows, base, strict=True))
            if base else None,
            "first_divergence": [_first_divergence(a.token_ids, b.token_ids) for a, b in zip(rows, base, strict=True)]
            if base else None,
            "per_prompt": [{"tokens": a.tokens, "seconds": round(a.seconds, 4), "prompt_ms": round(a.prompt_ms, 2),
                            "predicted_ms": round(a.predicted_ms, 2), "draft_n": a.draft_n,
                            "draft_n_accepted": a.draft_accepted, "draft_steps": a.draft_steps} for a in rows],
        }
        if base and out.get("baseline", {}).get("tokens_per_s"):
            out[method]["speedup"] = out[method]["tokens_per_s"] / out["baseline"]["tokens_per_s"]
            out[method]["whole_speedup"] = out[method]["whole_tokens_per_s"] / out["baseline"]["whole_tokens_per_s"]
            out[method]["spread"] = _speedup_spread(rows, base)
    dtype = facts.get("gguf_target") or "?"
    return {"methods": out, "backend": "llama.cpp", **facts, **provenance(f"gguf {dtype}")}


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first token where two answers part (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _decode_rate(rows: list[LlamaAnswer]) -> float:
    """llama.cpp's own generation rate: tokens over its predicted_ms (the prompt's processing left out)."""
    ms = sum(a.predicted_ms for a in rows)
    return sum(a.tokens for a in rows) / ms * 1000 if ms else 0.0


def _speedup_spread(rows: list[LlamaAnswer], base: list[LlamaAnswer]) -> dict[str, Any]:
    """The per-prompt speedups (each prompt's generation ms per token against the baseline's on the same prompt):
    their mean with its 95% t interval, min and max."""
    return mean_interval([(b.predicted_ms / b.tokens) / (a.predicted_ms / a.tokens)
                          for a, b in zip(rows, base, strict=True) if a.tokens and b.tokens and a.predicted_ms])
