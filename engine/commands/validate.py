"""`validate PATH [--json]`: vLLM's verdict and ours on a draft folder or a lone config.json."""

from __future__ import annotations

import argparse
import json

from engine.commands.flags import add_model_fields, options_from_args
from engine.format.options import ValidateOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help=ValidateOptions.model_fields["path"].description)
    add_model_fields(p, ValidateOptions, skip=("path",), keep_defaults=True, title="validate")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.format.checkpoint import read_config_dict
    from engine.format.validate import format_report, validate_draft

    o = options_from_args(args, ValidateOptions)
    verifier = read_config_dict(o.verifier) if o.verifier else None
    report = validate_draft(o.path, verifier_config=verifier, deep=o.deep, target=o.target)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1
