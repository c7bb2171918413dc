"""`targets`: list built-in targets and prepare the default one."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prepare", default="smollm2-135m-instruct",
                   help="built-in target to dequantize and cache now ('none' to skip)")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from engine.targets import BUILTIN_TARGETS, builtin_ready, builtin_cache_dir, prepare_builtin

    if args.prepare and args.prepare != "none":
        prepare_builtin(args.prepare)
    rows = [
        {"name": b.name, "hub_id": b.hub_id, "description": b.description,
         "cached": builtin_ready(builtin_cache_dir(b.name)), "path": str(builtin_cache_dir(b.name))}
        for b in BUILTIN_TARGETS.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['name']}  ({r['hub_id']})  {'ready' if r['cached'] else 'not prepared'}\n"
                  f"    {r['description']}\n    {r['path']}")
    return 0
