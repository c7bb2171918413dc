"""`bench`: baseline vs speculative methods on the same prompts; markdown table and optional JSON for the app."""

from __future__ import annotations

import argparse

from engine.targets import DECODE_DTYPE_HELP, DECODE_DTYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None,
                   help="target: built-in name, folder or hub id (default: the draft's verifier when it is available "
                        "here, else the built-in); one of another shape than the draft's verifier is refused")
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
    p.add_argument("--dtype", default="auto", choices=DECODE_DTYPES,
                   help="target dtype. vLLM backend: serving dtype, auto = bfloat16 (bf16 verification can flip "
                        "near-ties; float32 is exact). In-process: " + DECODE_DTYPE_HELP.split(": ", 1)[1])
    p.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def run(args: argparse.Namespace) -> int:
    from engine.fsutil import atomic_write_json
    from engine.jobs import reporter
    from engine.measure.bench import benchmark, markdown_table
    from engine.provenance import command_of

    skip = ("command", "_module", "verbose", "debug", "json_out", "accept_target_change")  # the last: read by cli
    options = {k: v for k, v in vars(args).items() if k not in skip}
    result = benchmark(**options, span=(0.0, 1.0))  # the job's progress: prompts done, time left
    flags = {**options, "accept_target_change": args.accept_target_change}
    result["command"] = command_of("bench", flags)
    print(markdown_table(result))
    if args.json_out:
        atomic_write_json(args.json_out, result)
        print(f"\nwrote {args.json_out}")
    reporter().update("done", 1.0, json=args.json_out)
    return 0
