"""`bench`: baseline vs speculative methods on the same prompts; markdown table and optional JSON for the app."""

from __future__ import annotations

import argparse

from engine.commands.flags import add_model_fields, options_from_args
from engine.fsutil import atomic_write_json
from engine.jobs import reporter
from engine.measure.options import BenchOptions
from engine.provenance import command_of


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, BenchOptions, title="bench")
    p.add_argument("--json", dest="json_out", default=None, help="write the result JSON here")


def run(args: argparse.Namespace) -> int:
    from engine.measure.bench import benchmark, markdown_table
    from engine.measure.speed import speed_lines

    options = options_from_args(args, BenchOptions)
    result = benchmark(options, span=(0.0, 1.0))  # the job's progress: prompts done, time left
    flags = {**options.model_dump(), "methods": ",".join(options.method_names()),  # what ran, so the command reruns
             "accept_target_change": args.accept_target_change}
    result["command"] = command_of("bench", flags)
    print("\n".join(speed_lines(result)) if options.ks else markdown_table(result))
    if args.json_out:
        atomic_write_json(args.json_out, result)
        print(f"\nwrote {args.json_out}")
    reporter().update("done", 1.0, json=args.json_out)
    return 0
