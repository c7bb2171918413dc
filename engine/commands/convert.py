"""`convert SRC --out DIR`: detect the source layout, show the mapping (`--dry-run`), convert, then prove the draft."""

from __future__ import annotations

import argparse
import json

from engine.commands.flags import add_model_fields, options_from_args
from engine.convert.base import ConvertJob
from engine.errors import WorkbenchError
from engine.jobs import reporter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="the source: a checkpoint folder, config.json, one .safetensors, a shard index, or a "
                   ".zip (size-limited, no absolute or '..' members)")
    p.add_argument("--out", help="output folder: new, empty, or an earlier output of the workbench")
    add_model_fields(p, ConvertJob, title="convert")
    p.add_argument("--dry-run", "--detect", dest="dry_run", action="store_true",
                   help="print the detected layout, the mapping table (source -> target, shape, dtype) and the "
                   "resulting config; nothing is written")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _print_detection(det) -> None:
    print(f"format: {det.format} — {det.title}")
    if det.kind in ("not-convertible", "unknown"):
        print(f"  why: {det.why}\n  instead: {det.instead}")


def _print_plan(p) -> None:
    from engine.convert.base import UNMAPPED

    _print_detection(p.detection)
    print(f"mapping ({len(p.rows)} tensors):")
    for r in p.rows:
        target = r.target if r.target is not None else "(UNMAPPED)" if r.note == UNMAPPED else \
            f"(dropped: {r.note})"
        print(f"  {r.source} {list(r.shape)} {r.dtype} -> {target}")
    print("config.json:")
    print(json.dumps(p.config, indent=2, sort_keys=True))
    for problem in p.problems:
        print(f"PROBLEM: {problem}")
    _print_defaulted(p.defaulted)


def _print_defaulted(defaulted: dict[str, str]) -> None:
    for name, why in defaulted.items():
        print(f"DEFAULT {name} = {why}")


def run(args: argparse.Namespace) -> int:
    from engine.convert import convert, detect, plan, verify

    options = options_from_args(args, ConvertJob)
    if args.dry_run or not args.out:
        det = detect(args.src)
        if det.kind != "convertible" and options.format is None:
            print(json.dumps({"detection": det.to_json()}, indent=2) if args.json else "", end="")
            if not args.json:
                _print_detection(det)
            return 0 if det.kind == "speculators" else 1
        p = plan(args.src, fmt=options.format, verifier=options.verifier, options=options,
                 allow_pickle=options.allow_pickle)
        print(json.dumps(p.to_json(), indent=2, default=str) if args.json else "", end="")
        if not args.json:
            _print_plan(p)
        if not args.out and not args.dry_run:
            raise WorkbenchError("no --out given", hint="add --out DIR to convert, or --dry-run to only look")
        return 1 if p.problems else 0
    defaulted: dict[str, str] = {}

    def said(p) -> None:
        defaulted.update(p.defaulted)
        reporter().update("writing the converted draft (step 2 of 3)", 0.4, **({"defaulted": defaulted}
                                                                            if defaulted else {}))

    reporter().update("reading and mapping the checkpoint (step 1 of 3)", 0.05)
    out = convert(args.src, args.out, options, on_plan=said)
    reporter().update("validating it and drafting a few tokens with it (step 3 of 3)", 0.6)
    verdict = verify(out, options.verifier)
    if args.json:
        print(json.dumps({"out": str(out), "verdict": verdict.to_json(), "defaulted": defaulted}, indent=2))
    else:
        print(f"converted -> {out}")
        _print_defaulted(defaulted)
        print(f"validate: {'OK' if verdict.valid else 'FAILED'}")
        for e in verdict.errors:
            print(f"  {e}")
        print(f"load into the workbench's model: {verdict.loaded}")
        print(f"short draft through the decode engine: {verdict.drafted}")
    return 0 if verdict.valid and not verdict.drafted.startswith("failed") else 1
