"""`evaluate`: decoding-exact acceptance per k on held-out target outputs, without decoding; speedup forecast."""

from __future__ import annotations

import argparse

from engine.targets import DECODE_DTYPE_HELP, DECODE_DTYPES


def _ks(text: str) -> list[int]:
    try:
        if "-" in text or ".." in text:
            lo, hi = text.replace("..", "-").split("-")
            return list(range(int(lo), int(hi) + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of k values (e.g. 1,2,3 or 1-5)") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=None, help="draft folder (default: the shipped draft of a built-in target)")
    p.add_argument("--target", default=None,
                   help="target: built-in name, folder or hub id (default: the draft's verifier when it is available "
                        "here, else the built-in); one of another shape than the draft's verifier is refused")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", default=None,
                     help="extracted hidden states of held-out target outputs (`extract` of a regenerated val split); "
                          "the fast path: no target forward at all")
    src.add_argument("--dataset", default="sharegpt",
                     help="a dataset whose held-out (val) prompts the target answers once, greedily "
                          "(default: sharegpt)")
    p.add_argument("--num-prompts", type=int, default=20, help="held-out prompts or samples to use (default: 20)")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="answer length, as `bench --max-new-tokens` (0 = the data's whole answers)")
    p.add_argument("--k", type=_ks, default=None,
                   help="k values, e.g. 1,2,3 or 1-5 (default: 1..max(5, the draft's k))")
    p.add_argument("--max-prompt-chars", type=int, default=1500, help="skip longer held-out prompts (as bench)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="also the expected acceptance of sampled decoding at this temperature (sum of min(p, q) per "
                        "position along the greedy walk: an expectation, not a walk; online only)")
    p.add_argument("--forecast", action="store_true",
                   help="measure the target's verify cost and the draft's cost per step here and forecast the speedup")
    p.add_argument("--dtype", choices=DECODE_DTYPES, default="auto", help=DECODE_DTYPE_HELP)
    p.add_argument("--all-drafts", action="store_true",
                   help="verify every drafted token: a proposer's own cut (fewer drafts when it is not confident) "
                        "is not applied, so the table scores the draft's tokens alone, not what decoding would verify")
    p.add_argument("--walks", action="store_true", help="keep each sample's accepted-count sequence in the JSON")
    p.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")
    p.add_argument("--write-card", action="store_true",
                   help="put the table (and forecast) into the draft's model card, README.md in the draft folder")
    p.add_argument("--write-k", action="store_true",
                   help="with --forecast: write the recommended k into the draft's config.json "
                        "(speculators_config.proposal_methods[0].speculative_tokens)")


def _options(args: argparse.Namespace) -> dict:
    """The options as flags name them (`--json`, not its dest; `--dataset` only without `--data`)."""
    skip = {"command", "_module", "verbose", "debug"} | ({"dataset"} if args.data else set())
    return {("json" if k == "json_out" else k): v for k, v in vars(args).items() if k not in skip}


def run(args: argparse.Namespace) -> int:
    from engine.fsutil import atomic_write_json
    from engine.jobs import reporter
    from engine.measure.evaluate import evaluate_draft, format_table
    from engine.provenance import command_of

    reporter().phase("loading the target and the draft")
    result = evaluate_draft(draft=args.draft, target=args.target, data=args.data,
                            dataset=None if args.data else args.dataset, num_prompts=args.num_prompts,
                            max_new_tokens=args.max_new_tokens or None, ks=args.k,
                            max_prompt_chars=args.max_prompt_chars, seed=args.seed, measure_speed=args.forecast,
                            keep_walks=args.walks, temperature=args.temperature, dtype=args.dtype,
                            all_drafts=args.all_drafts)
    result["command"] = command_of("evaluate", _options(args))
    print(f"{result['algorithm']} draft {result['draft']} on {result['num_samples']} held-out samples "
          f"({result['seconds']:.1f} s for the draft pass); greedy decoding, vLLM's definitions"
          + (", every drafted token verified (no proposer cut)" if args.all_drafts else "") + ":\n")
    print(format_table(result, result.get("forecast")))
    if args.temperature > 0:
        print(f"\nsampled decoding at temperature {args.temperature} (an expectation from p and q, not a walk):")
        for key, acc in result["by_k"].items():
            if "expected_mean_acceptance_length" in acc:
                print(f"  k={key}: expected mean acceptance length {acc['expected_mean_acceptance_length']:.3f}, "
                      "per position " + ", ".join(f"{x:.3f}" for x in acc["expected_per_position_acceptance"]))
    oov = result.get("out_of_draft_vocab_fraction")
    if oov is not None:
        print(f"\n{100 * oov:.1f}% of the answers' tokens are outside the draft vocabulary (never proposable).")
    fc = result.get("forecast")
    if fc:
        from engine.measure.step_costs import recommendation

        print(f"{recommendation(fc)} (one target step {fc['target_step_ms']:.1f} ms)")
    if args.json_out:
        atomic_write_json(args.json_out, result)
        print(f"wrote {args.json_out}")
    if args.write_card:
        from pathlib import Path

        from engine.recipes.model_card import write_evaluation_section

        print(f"wrote {write_evaluation_section(Path(result['draft']) / 'README.md', result)}")
    if args.write_k:
        if not fc:
            from engine.errors import WorkbenchError

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
