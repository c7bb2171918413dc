"""`convert SRC --out DIR`: detect the source layout, show the mapping (`--dry-run`), convert, then prove the draft."""

from __future__ import annotations

import argparse
import json

from engine.errors import WorkbenchError
from engine.jobs import reporter


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.convert import CONVERTERS, ConvertOptions

    fields = ConvertOptions.model_fields
    p.add_argument("src", help="the source: a checkpoint folder, config.json, one .safetensors, a shard index, or a "
                   ".zip (size-limited, no absolute or '..' members)")
    p.add_argument("--out", help="output folder: new, empty, or an earlier output of the workbench")
    p.add_argument("--format", default=None, choices=CONVERTERS.names(), help="source layout (default: detected)")
    p.add_argument("--target", "--verifier", dest="verifier", default=None,
                   help="the verifier: a hub id (written into the config) or a local folder; its config.json, when "
                   "on this machine, supplies vocab size, hidden size and depth, and the draft is then test-drafted")
    p.add_argument("--aux-layer-ids", default=None, help=fields["aux_layer_ids"].description)
    p.add_argument("--norm-before-residual", default=None, action=argparse.BooleanOptionalAction,
                   help=fields["norm_before_residual"].description)
    p.add_argument("--mask-token-id", type=int, default=None, help=fields["mask_token_id"].description)
    p.add_argument("--speculative-tokens", type=int, default=None, help=fields["speculative_tokens"].description)
    p.add_argument("--allow-pickle", action="store_true",
                   help="read .bin/.pt weights (torch.load(weights_only=True)); only for files you trust")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out even if it holds files the workbench did not write (they are deleted)")
    p.add_argument("--dry-run", "--detect", dest="dry_run", action="store_true",
                   help="print the detected layout, the mapping table (source -> target, shape, dtype) and the "
                   "resulting config; nothing is written")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _options(args: argparse.Namespace):
    from engine.convert import ConvertOptions

    try:
        aux = [int(x) for x in args.aux_layer_ids.split(",") if x.strip()] if args.aux_layer_ids else None
    except ValueError as exc:
        raise WorkbenchError(f"--aux-layer-ids '{args.aux_layer_ids}' is not a comma-separated list of integers",
                             hint="e.g. --aux-layer-ids 2,15,27") from exc
    return ConvertOptions(aux_layer_ids=aux, norm_before_residual=args.norm_before_residual,
                          mask_token_id=args.mask_token_id, speculative_tokens=args.speculative_tokens)


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

    options = _options(args)
    if args.dry_run or not args.out:
        det = detect(args.src)
        if det.kind != "convertible" and args.format is None:
            print(json.dumps({"detection": det.to_json()}, indent=2) if args.json else "", end="")
            if not args.json:
                _print_detection(det)
            return 0 if det.kind == "speculators" else 1
        p = plan(args.src, fmt=args.format, verifier=args.verifier, options=options, allow_pickle=args.allow_pickle)
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
    out = convert(args.src, args.out, fmt=args.format, verifier=args.verifier, allow_pickle=args.allow_pickle,
                  overwrite=args.overwrite, options=options, on_plan=said)
    reporter().update("validating it and drafting a few tokens with it (step 3 of 3)", 0.6)
    verdict = verify(out, args.verifier)
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
