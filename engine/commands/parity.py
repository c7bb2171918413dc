"""`parity DRAFT`: the draft's training record against how vLLM will serve it, each difference with its effect."""

from __future__ import annotations

import argparse
import json

from engine.commands.flags import add_model_fields, options_from_args
from engine.measure.options import ParityOptions
from engine.measure.parity import parity, parity_table


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, ParityOptions, title="parity")
    p.add_argument("--json", dest="json_out", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    o = options_from_args(args, ParityOptions)
    result = parity(o.draft, run=o.run, target=o.target, dtype=o.dtype, max_model_len=o.max_model_len)
    if args.json_out:
        print(json.dumps(result, indent=2))
        return 0
    print(f"Training against serving for {result['draft']} (run: {result['run'] or 'no training record found'}; "
          f"served beside {result['target']}, {result['dtype']}, up to {result['max_model_len']} tokens):\n")
    print(parity_table(result))
    print(f"\n{result['differences']} difference(s), {result['unknown']} factor(s) not recorded.")
    if result["run"] is None:
        print("Without the training run nothing can be compared: pass --run (the --out folder of `train`).")
    return 0
