"""`repair DRAFT`: store the verifier's embedding in a draft that lacks it (validate's embed_tokens warning)."""

from __future__ import annotations

import argparse

from engine.commands.flags import add_model_fields, options_from_args
from engine.errors import WorkbenchError
from engine.format.options import RepairOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help=RepairOptions.model_fields["path"].description)
    add_model_fields(p, RepairOptions, skip=("path",), keep_defaults=True, title="repair")


def run(args: argparse.Namespace) -> int:
    from engine.format.repair import EMBED, add_embeddings, embedding_need
    from engine.format.validate import validate_draft
    from engine.targets.identity import draft_verifier
    from engine.targets.verifier import load_verifier_parts

    o = options_from_args(args, RepairOptions)
    need = embedding_need(o.path)
    if not need.missing:
        print(f"nothing to repair in {o.path}: {need.reason}")
        return 0
    verifier = o.target or draft_verifier(o.path)
    if not verifier:
        raise WorkbenchError("the draft's config names no verifier (speculators_config.verifier.name_or_path)",
                             where=o.path, hint="give --target the model the draft was trained for")
    parts = load_verifier_parts(verifier)
    written = add_embeddings(o.path, parts.embed_tokens().weight, out=o.out, overwrite=o.overwrite)
    report = validate_draft(written)
    left = [w for w in report.warnings + report.errors if w.field == f"tensor:{EMBED}"]
    print(f"stored {EMBED} {list(need.shape)} from {parts.ref.name} in {written}; validate: "
          f"{'pass' if report.ok and not left else 'see python -m engine validate ' + str(written)}")
    return 0 if report.ok and not left else 1
