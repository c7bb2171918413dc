"""`bench`: baseline vs speculative methods on the same prompts; markdown table and optional JSON for the app."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="target: built-in name, folder or hub id")
    p.add_argument("--draft", default=None, help="draft folder (default: the shipped draft of a built-in target)")
    p.add_argument("--prompts", default="sharegpt",
                   help="JSONL file ({'prompt': str} or {'messages': [...]} per line) or a built-in dataset name "
                        "(its held-out prompts)")
    p.add_argument("--num-prompts", type=int, default=20, help="prompts to use")
    p.add_argument("--max-prompt-chars", type=int, default=1500,
                   help="skip built-in held-out prompts longer than this (keeps CPU runs short)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=3, help="draft tokens per step")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default="baseline,draft,ngram,hf_prompt_lookup,hf_assisted",
                   help="comma-separated subset of baseline,draft,ngram,hf_prompt_lookup,hf_assisted")
    p.add_argument("--assistant", default=None, help="assistant model folder for hf_assisted")
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers",
                   help="in-process engine, or real vLLM through its OpenAI API and /metrics")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="vLLM backend: serving dtype (bf16 verification can flip near-ties; float32 is exact)")
    p.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def run(args: argparse.Namespace) -> int:
    import torch

    from engine.errors import WorkbenchError
    from engine.fsutil import atomic_write_json
    from engine.generate.bench import ALL_METHODS, load_prompts, markdown_table, run_bench
    from engine.generate.sampling import SamplingParams
    from engine.jobs import reporter
    from engine.targets import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad:
        raise WorkbenchError(f"unknown methods {bad}", hint=f"choose from {list(ALL_METHODS)}")
    prompts = load_prompts(args.prompts, args.num_prompts, args.seed, args.max_prompt_chars)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    reporter().update(f"benchmarking {len(prompts)} prompts", 0.0)
    if args.backend == "vllm":
        from engine.generate.api import default_draft
        from engine.serve.bench import run_vllm_bench

        draft = args.draft or default_draft(args.target)
        result = run_vllm_bench(prompts, target=args.target, draft=draft, k=args.k,
                                max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                                methods=tuple(m for m in methods if m in ("baseline", "draft", "ngram")),
                                dtype=args.dtype, tokenize=True)
    else:
        target = load_target(args.target)
        result = run_bench(target, prompts, methods=methods, draft=args.draft, assistant=args.assistant, k=args.k,
                           params=params)
    result["command"] = "python -m engine bench " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if k not in ("command", "_module", "verbose", "json_out") and v is not None)
    print(markdown_table(result))
    if args.json_out:
        atomic_write_json(args.json_out, result)
        print(f"\nwrote {args.json_out}")
    reporter().update("done", 1.0, json=args.json_out)
    return 0
