"""`evaluate`: decoding-exact acceptance per k on held-out target outputs, without decoding; speedup forecast."""

from __future__ import annotations

import argparse

from engine.commands.flags import add_model_fields, options_from_args
from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_json
from engine.jobs import reporter
from engine.measure.options import EvaluateOptions
from engine.measure.step_costs import recommendation
from engine.provenance import command_of


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, EvaluateOptions, title="evaluate")
    p.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")
    p.add_argument("--write-card", action="store_true",
                   help="put the table (and forecast) into the draft's model card, README.md in the draft folder")
    p.add_argument("--write-k", action="store_true",
                   help="with --forecast: write the recommended k into the draft's config.json "
                        "(speculators_config.proposal_methods[0].speculative_tokens)")


def _flags(options: EvaluateOptions, args: argparse.Namespace) -> dict:
    """The options as flags name them (`--dataset` only without `--data`), then the output flags."""
    values = options.model_dump(exclude={"dataset"} if options.data else set())
    return {**values, "json": args.json_out, "write_card": args.write_card, "write_k": args.write_k}


def run(args: argparse.Namespace) -> int:
    from engine.measure.evaluate import evaluate_draft, format_table, p_min_advice

    options = options_from_args(args, EvaluateOptions)
    if args.write_k and (options.p_min or options.method != "draft"):  # refused before minutes of evaluation
        raise WorkbenchError("--write-k writes the k vLLM serves, and vLLM drafts without --p-min or draft_ngram",
                             hint="evaluate the plain draft (no --p-min, --method draft) to write its k")
    reporter().phase("loading the target and the draft", progress=0.0)  # the bar and its estimate from the start
    result = evaluate_draft(options)
    result["command"] = command_of("evaluate", _flags(options, args))
    print(f"{result['algorithm']} draft {result['draft']} on {result['num_samples']} held-out samples "
          f"({result['seconds']:.1f} s for the draft pass); greedy decoding, vLLM's definitions"
          + (", every drafted token verified (no proposer cut)" if options.all_drafts else "") + ":\n")
    print(format_table(result, result.get("forecast")))
    if options.temperature > 0:
        print(f"\nsampled decoding at temperature {options.temperature} (an expectation from p and q, not a walk):")
        for key, acc in result["by_k"].items():
            if "expected_mean_acceptance_length" in acc:
                print(f"  k={key}: expected mean acceptance length {acc['expected_mean_acceptance_length']:.3f}, "
                      "per position " + ", ".join(f"{x:.3f}" for x in acc["expected_per_position_acceptance"]))
    oov = result.get("out_of_draft_vocab_fraction")
    if oov is not None:
        print(f"\n{100 * oov:.1f}% of the answers' tokens are outside the draft vocabulary (never proposable).")
    fc = result.get("forecast")
    if fc:
        print(f"{recommendation(fc)} (one target step {fc['target_step_ms']:.1f} ms)")
        if advice := p_min_advice(result):
            print(advice)
    fl = result.get("forecast_llamacpp")
    if fl:
        print("\nllama.cpp forecast (step costs measured on llama-server here): " + ", ".join(
            f"k={k}: {r['speedup']:.2f}×" for k, r in fl["by_k"].items() if r["speedup"]))
        print(fl["advice"])
    if args.json_out:
        atomic_write_json(args.json_out, result)
        print(f"wrote {args.json_out}")
    if args.write_card:
        from pathlib import Path

        from engine.recipes.model_card import write_evaluation_section

        print(f"wrote {write_evaluation_section(Path(result['draft']) / 'README.md', result)}")
    if args.write_k:
        if not fc:
            raise WorkbenchError("--write-k needs --forecast (the recommendation comes from measured costs)")
        if fc.get("recommended_k") is None:
            print("config.json left as it is: no k forecasts a speedup on this machine")
            reporter().update("done", 1.0, json=args.json_out)
            return 0
        from engine.format.checkpoint import write_speculative_tokens

        write_speculative_tokens(result["draft"], fc["recommended_k"])
        print(f"speculative_tokens = {fc['recommended_k']} written to {result['draft']}/config.json")
    reporter().update("done", 1.0, json=args.json_out)
    return 0
