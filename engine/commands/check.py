"""`check DATA [--full] [--json]`: check extracted hidden-state files before training on them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.errors import WorkbenchError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="a folder of hs_{i}.safetensors files (the --out of `extract`)")
    p.add_argument("--full", action="store_true",
                   help="also read every hidden state (finite values) and compare each file with the digest it "
                        "recorded when written (without it: headers, shapes, dtypes, token ids and loss masks only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from engine.data.check import check_folder

    report = check_folder(args.data, full=args.full,
                          progress=lambda xs: tqdm(xs, desc="check", unit="file", dynamic_ncols=True))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['files']} files, {report['tokens']} tokens checked ({'full' if args.full else 'quick'})")
        for bad in report["bad"]:
            print(f"  BAD {bad['file']}: {bad['problem']}")
    if report["bad"]:
        shown = "; ".join(f"{Path(b['file']).name}: {b['problem']}" for b in report["bad"][:5])
        raise WorkbenchError(f"{len(report['bad'])} of {report['files']} files fail the checks "
                             f"({report['bad_tokens']} tokens): {shown}", where=str(args.data),
                             hint="re-run the extraction into a new folder, remove the files named above, or train "
                                  "with --bad-samples skip to leave them out")
    return 0
