"""`targets`: list built-in targets, prepare the default one, and show the kernel path decoding uses on this CPU."""

from __future__ import annotations

import argparse
import json

from engine.commands.flags import add_model_fields, options_from_args
from engine.cpu import describe
from engine.targets.options import TargetsOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, TargetsOptions, keep_defaults=True, title="targets")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from engine.generate.kernel_choice import choose, read_cached
    from engine.targets.dtypes import pick_device
    from engine.targets.resolve import BUILTIN_TARGETS, builtin_cache_dir, builtin_ready, prepare_builtin

    o = options_from_args(args, TargetsOptions)
    prepare = o.prepare if o.prepare and o.prepare != "none" else None
    if prepare:
        prepare_builtin(prepare)
    rows = []
    for b in BUILTIN_TARGETS.values():
        ready = builtin_ready(builtin_cache_dir(b.name))
        kernel = None
        if ready and pick_device(None) == "cpu":
            kernel = choose(b.name, refresh=True) if o.measure_kernels and b.name == prepare else read_cached(b.name)
        rows.append({"name": b.name, "hub_id": b.hub_id, "description": b.description, "cached": ready,
                     "path": str(builtin_cache_dir(b.name)), "kernel": kernel.to_dict() if kernel else None,
                     "kernel_summary": kernel.summary() if kernel else None})
    if args.json:
        print(json.dumps({"cpu": describe(), "targets": rows}, indent=2))
        return 0
    print(f"CPU: {describe()}")
    for r in rows:
        kernel = r["kernel_summary"] or ("not measured yet (the first decoding load measures it; --measure-kernels "
                                         "now)" if r["cached"] else "-")
        print(f"{r['name']}  ({r['hub_id']})  {'ready' if r['cached'] else 'not prepared'}\n"
              f"    {r['description']}\n    {r['path']}\n    kernel path: {kernel}")
    return 0
