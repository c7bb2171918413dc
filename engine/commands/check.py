"""`check DATA [--full] [--json]`: check extracted hidden-state files before training on them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.commands.flags import add_model_fields, options_from_args
from engine.data.options import CheckOptions
from engine.errors import WorkbenchError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help=CheckOptions.model_fields["data"].description)
    add_model_fields(p, CheckOptions, skip=("data",), keep_defaults=True, title="check")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from engine.data.store.check import check_folder

    o = options_from_args(args, CheckOptions)
    report = check_folder(o.data, full=o.full,
                          progress=lambda xs: tqdm(xs, desc="check", unit="file", dynamic_ncols=True))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['files']} files, {report['tokens']} tokens checked ({'full' if o.full else 'quick'})")
        for bad in report["bad"]:
            print(f"  BAD {bad['file']}: {bad['problem']}")
    if report["bad"]:
        shown = "; ".join(f"{Path(b['file']).name}: {b['problem']}" for b in report["bad"][:5])
        raise WorkbenchError(f"{len(report['bad'])} of {report['files']} files fail the checks "
                             f"({report['bad_tokens']} tokens): {shown}", where=str(o.data),
                             hint="re-run the extraction into a new folder, remove the files named above, or train "
                                  "with --bad-samples skip to leave them out")
    return 0
