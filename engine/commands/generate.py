"""`generate`: one prompt through the target, with or without speculative decoding; streams the text."""

from __future__ import annotations

import argparse
import json
import sys

from engine.targets.dtypes import DECODE_DTYPE_HELP, DECODE_DTYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt (chat-templated as one user turn)")
    p.add_argument("--target", default=None,
                   help="target: built-in name, folder or hub id (default: the draft's verifier when it is available "
                        "here, else the built-in); one of another shape than the draft's verifier is refused")
    p.add_argument("--method", default="draft", choices=["baseline", "draft", "ngram"])
    p.add_argument("--draft", default=None, help="draft folder (default: the shipped draft of a built-in target)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=DECODE_DTYPES, default="auto", help=DECODE_DTYPE_HELP)
    p.add_argument("--events", action="store_true", help="print one JSON event per step instead of text")


def run(args: argparse.Namespace) -> int:
    from engine.algos.loading import make_proposer
    from engine.generate.kernel_choice import load_decode_target
    from engine.generate.metrics import SpecMetrics
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)  # checked before the target is loaded
    from engine.targets.identity import target_for_draft
    from engine.targets.resolve import DEFAULT_TARGET

    draft = args.draft if args.method != "baseline" and args.method != "ngram" else None
    target = load_decode_target(target_for_draft(draft, args.target) or DEFAULT_TARGET, args.dtype)
    tok = target.tokenizer
    params.eos_token_ids = [tok.eos_token_id]
    proposer = make_proposer(args.method, target, draft=args.draft)
    runner = TargetRunner(target, getattr(proposer, "aux_layer_ids", None))
    metrics = SpecMetrics()
    out: list[int] = []
    printed = ""
    for event in generate(runner, prompt_ids(tok, args.prompt), params, proposer, args.k):
        metrics.observe(event)
        out.extend(event.tokens)
        if args.events:
            print(json.dumps(event.to_dict()))
            continue
        text = tok.decode(out, skip_special_tokens=True)
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        printed = text
    tau = metrics.mean_acceptance_length
    print(f"\n\n[{metrics.num_tokens} tokens, {metrics.tokens_per_s:.1f} tokens/s"
          + (f", mean acceptance length {tau:.2f}" if tau else "") + "]", file=sys.stderr)
    return 0
