"""`validate PATH [--json]`: vLLM's verdict and ours on a draft folder or a lone config.json."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="draft folder (config + weights) or a config.json (config only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--deep", action="store_true", help="also load every tensor and check it is finite")
    p.add_argument("--verifier", default=None, help="verifier folder whose config.json to check against")


def run(args: argparse.Namespace) -> int:
    from engine.format.checkpoint import read_config_dict
    from engine.format.validate import format_report, validate_draft

    verifier = read_config_dict(args.verifier) if args.verifier else None
    report = validate_draft(args.path, verifier_config=verifier, deep=args.deep)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1
