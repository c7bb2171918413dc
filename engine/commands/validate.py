"""`validate PATH [--json]`: vLLM's verdict and ours on a draft folder or a lone config.json."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="draft folder (config + weights) or a config.json (config only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--deep", action="store_true", help="check every tensor is finite even in drafts over 4 GiB "
                   "(smaller ones are always checked)")
    p.add_argument("--verifier", default=None, help="verifier folder whose config.json to check against")
    p.add_argument("--target", default=None, help="the target the draft will run with (built-in name, folder or "
                   "hub id): a draft trained for another verifier is an error")


def run(args: argparse.Namespace) -> int:
    from engine.format.checkpoint import read_config_dict
    from engine.format.validate import format_report, validate_draft

    verifier = read_config_dict(args.verifier) if args.verifier else None
    report = validate_draft(args.path, verifier_config=verifier, deep=args.deep, target=args.target)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1
