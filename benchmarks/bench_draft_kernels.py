"""The shipped draft with its linears on packed weights against plain `F.linear`, interleaved in one run."""

# One target (the built-in, `--dtype`, auto by default), the baseline and the shipped draft twice at one k: as loaded
# (plain `F.linear` on its weights) and with `engine.generate.cpu_kernels.pack_draft_linears` (what `make_proposer`
# does where oneDNN's packed linear runs in the draft's dtype). Every prompt runs the three methods in rotated order
# (`engine.measure.speed`); rounds repeat; each speedup is the baseline's time over the method's, with its mean and
# 95% interval over rounds. Outputs and acceptance must be the same for both drafts.
#
#     .venv/bin/python benchmarks/bench_draft_kernels.py --prompts 12 --max-new-tokens 128 --k 3 --rounds 4 \
#         --json benchmarks/results/decode_speed/<cpu-kind>-draft-kernels.json

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dtype", default="auto", help="the target's decode dtype (auto: the measured kernel path; "
                        "fp32: forced, the draft in fp32 beside it)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from benchmarks._results import command_line, print_and_save
    from engine.algos.loading import load_draft_proposer, make_proposer
    from engine.algos.shipped import default_draft
    from engine.data.prompts.load import load_prompts
    from engine.generate.cpu_kernels import linear_form, routed_linears
    from engine.generate.kernel_choice import load_decode_target
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.measure import speed
    from engine.measure.spread import mean_interval
    from engine.targets.dtypes import dtype_name

    target = load_decode_target("smollm2-135m-instruct", args.dtype)
    plain = load_draft_proposer(default_draft(target.ref.name), target)
    packed = make_proposer("draft", target)
    runner = TargetRunner(target, plain.aux_layer_ids)
    methods = [speed.Method("baseline", 0), speed.Method("plain", args.k, plain),
               speed.Method("packed", args.k, packed)]
    for m in methods:
        m.runner = runner
    encoded = [prompt_ids(target.tokenizer, p) for p in load_prompts("sharegpt", args.prompts, 0, 1500)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, eos_token_ids=[target.tokenizer.eos_token_id])
    for m in methods:  # one-time costs (weights packed, kernels primed) before timing
        speed.decode_one(m, encoded[0], dataclasses.replace(params, max_new_tokens=8))
    rounds = [speed.timed_round(methods, encoded, params, first=r == 0) for r in range(args.rounds)]
    base = methods[0]
    rows = []
    for m in methods[1:]:
        spread = mean_interval([base.seconds[r] / m.seconds[r] for r in range(args.rounds)])
        draft = m.proposer.draft
        form = linear_form(draft) if routed_linears(draft) else "F.linear"
        rows.append({"draft_linears": m.name, "linear_form": form, "k": args.k,
                     "speedup": spread["mean"], "ci95": spread["ci95"],
                     "mean_acceptance_length": m.metrics.mean_acceptance_length,
                     "identical_to_baseline": m.outputs == base.outputs})
    lines = ["| draft linears | form | k | mean acceptance length | speedup (95% interval over rounds) | identical |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['draft_linears']} | {r['linear_form']} | {r['k']} | {r['mean_acceptance_length']:.3f} | "
                     f"{r['speedup']:.3f}× ({r['ci95'][0]:.3f}–{r['ci95'][1]:.3f}) | "
                     f"{'yes' if r['identical_to_baseline'] else 'no'} |")
    result = {"command": command_line("bench_draft_kernels.py", argv), "dtype": dtype_name(target.dtype),
              "kernel": (target.extra.get("kernel") or {}).get("path"), "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "rows": rows, "rounds": rounds}
    print_and_save(result, "\n".join(lines), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
