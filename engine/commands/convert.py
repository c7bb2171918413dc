"""`convert SRC --out DIR`: detect the source format, show the key mapping, convert, validate."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="research checkpoint folder (config.json + weights)")
    p.add_argument("--out", help="output folder for the speculators draft")
    p.add_argument("--format", default=None, help="source format (default: detected)")
    p.add_argument("--target", "--verifier", dest="verifier", default=None,
                   help="the verifier's hub id (written into the config; used for checks when available locally)")
    p.add_argument("--aux-layer-ids", default=None, help="verifier layer ids the draft reads, when the source does not record them, e.g. 2,15,27")
    p.add_argument("--norm-before-residual", action="store_true", help="the draft was trained with norm_before_residual (chain drafters)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="read .bin/.pt weights (torch.load(weights_only=True)); only for files you trust")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out even if it holds files the workbench did not write (they are deleted)")
    p.add_argument("--detect", action="store_true", help="only print the detected format and the key mapping")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from engine.convert import detect, mapping_table
    from engine.convert.base import convert
    from engine.errors import WorkbenchError
    from engine.format.validate import format_report, validate_draft

    det = detect(args.src)
    table = mapping_table(args.src, args.format)
    if args.detect or not args.out:
        if args.json:
            print(json.dumps({"format": det.format, "description": det.description, "mapping": table}, indent=2))
        else:
            print(f"{args.src}: {det.format} — {det.description}")
            for src, dst in table:
                print(f"  {src} -> {dst if dst is not None else '(dropped)'}")
        if not args.out and not args.detect:
            raise WorkbenchError("no --out given", hint="add --out DIR to convert")
        return 0
    options = {}
    if args.aux_layer_ids:
        options["aux_layer_ids"] = [int(x) for x in args.aux_layer_ids.split(",") if x.strip()]
    if args.norm_before_residual:
        options["norm_before_residual"] = True
    out = convert(args.src, args.out, fmt=args.format, verifier=args.verifier, allow_pickle=args.allow_pickle,
                  overwrite=args.overwrite, **options)
    report = validate_draft(out)
    if args.json:
        print(json.dumps({"format": det.format, "out": str(out), "validation": report.to_json()}, indent=2))
    else:
        print(f"converted {det.format} -> {out}")
        print(format_report(report))
    return 0 if report.ok else 1
