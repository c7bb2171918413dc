"""`generate`: one prompt through the target, with or without speculative decoding; streams the text."""

from __future__ import annotations

import argparse
import json
import sys

from engine.commands.flags import add_model_fields, options_from_args
from engine.generate.metrics import SpecMetrics
from engine.generate.options import GenerateOptions
from engine.generate.prompt import prompt_ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt (chat-templated as one user turn)")
    add_model_fields(p, GenerateOptions, keep_defaults=True)


def run(args: argparse.Namespace) -> int:
    o = options_from_args(args, GenerateOptions)
    # torch and the models load when the command runs, not for --help
    from engine.algos.loading import make_proposer
    from engine.generate.kernel_choice import load_decode_target
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate
    from engine.targets.identity import target_for_draft
    from engine.targets.resolve import DEFAULT_TARGET

    params = SamplingParams(max_new_tokens=o.max_new_tokens, temperature=o.temperature, top_p=o.top_p,
                            top_k=o.top_k, seed=o.seed)  # checked before the target is loaded
    draft = o.draft if o.method in ("draft", "draft_ngram") else None
    target = load_decode_target(target_for_draft(draft, o.target) or DEFAULT_TARGET, o.dtype)
    tok = target.tokenizer
    params.eos_token_ids = [tok.eos_token_id]
    proposer = make_proposer(o.method, target, draft=o.draft, p_min=o.p_min, ngram_min_match=o.ngram_min_match)
    runner = TargetRunner(target, getattr(proposer, "aux_layer_ids", None))
    metrics = SpecMetrics()
    out: list[int] = []
    printed = ""
    for event in generate(runner, prompt_ids(tok, args.prompt), params, proposer, o.k):
        metrics.observe(event)
        out.extend(event.tokens)
        if o.events:
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
