"""`repair DRAFT`: store the verifier's embedding in a draft that lacks it (validate's embed_tokens warning)."""

from __future__ import annotations

import argparse

from engine.errors import WorkbenchError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="draft folder (config.json + safetensors)")
    p.add_argument("--target", default=None, help="the verifier whose embedding to store (built-in name, folder or "
                   "hub id in the local cache); default: the draft's speculators_config.verifier.name_or_path")
    p.add_argument("--out", default=None, help="write the repaired draft to this new folder instead (required for "
                   "a folder the workbench did not write; the source is never changed then)")
    p.add_argument("--overwrite", action="store_true", help="with --out: replace an existing folder there")


def run(args: argparse.Namespace) -> int:
    import engine.algos  # noqa: F401  (registers the config types)
    from engine.format.repair import EMBED, add_embeddings, embedding_need
    from engine.format.validate import validate_draft
    from engine.targets.identity import draft_verifier
    from engine.targets.verifier import load_verifier_parts

    need = embedding_need(args.path)
    if not need.missing:
        print(f"nothing to repair in {args.path}: {need.reason}")
        return 0
    verifier = args.target or draft_verifier(args.path)
    if not verifier:
        raise WorkbenchError("the draft's config names no verifier (speculators_config.verifier.name_or_path)",
                             where=args.path, hint="give --target the model the draft was trained for")
    parts = load_verifier_parts(verifier)
    written = add_embeddings(args.path, parts.embed_tokens().weight, out=args.out, overwrite=args.overwrite)
    report = validate_draft(written)
    left = [w for w in report.warnings + report.errors if w.field == f"tensor:{EMBED}"]
    print(f"stored {EMBED} {list(need.shape)} from {parts.ref.name} in {written}; validate: "
          f"{'pass' if report.ok and not left else 'see python -m engine validate ' + str(written)}")
    return 0 if report.ok and not left else 1
