"""`prepare`, `regenerate`, `extract`: render data with loss masks, re-answer it with the target, extract states."""

from __future__ import annotations

import argparse
import json
import sys

from engine.commands.flags import add_model_fields, options_from_args
from engine.data.options import ExtractOptions, PrepareOptions, RegenerateOptions
from engine.fsutil import atomic_write_text
from engine.jobs import reporter

# -- prepare ---------------------------------------------------------------------------------------


def add_prepare_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, PrepareOptions, title="prepare", keep_defaults=True)
    p.add_argument("--json", action="store_true", help="print the summary as JSON (no preview)")


def run_prepare(args: argparse.Namespace) -> int:
    from engine.data.render.chat import format_segments, mask_segments, render_dataset
    from engine.targets.loading import load_target

    o = options_from_args(args, PrepareOptions)
    reporter().update("loading target")
    target = load_target(o.target, with_tokenizer=True)
    reporter().update("rendering dataset")
    rows, summary, stats = render_dataset(o.dataset, target.tokenizer, split=o.split, max_samples=o.max_samples,
                                          max_length=o.max_length, val_fraction=o.val_fraction, seed=o.seed)
    if o.out:
        atomic_write_text(o.out, "".join(json.dumps(r.to_json()) + "\n" for r in rows))
    result = {**summary.to_json(), **{f"rendered_{k}": v for k, v in stats.to_json().items()},
              "max_length": o.max_length, "out": o.out}
    reporter().update("done", 1.0, **{k: v for k, v in result.items() if not isinstance(v, dict)})
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(summary.format())
    print(f"rendered {stats.rows} rows: {stats.tokens} tokens, {stats.loss_tokens} loss tokens "
          f"({stats.truncated} truncated to {o.max_length})" + (f"; wrote {o.out}" if o.out else ""))
    color = sys.stdout.isatty()
    for row in rows[: max(0, o.preview)]:
        text = format_segments(mask_segments(target.tokenizer, row.input_ids, row.loss_mask), color=color)
        cut = len(text) > o.preview_chars
        print(f"\n--- row {row.id} ({row.num_tokens} tokens, {row.num_loss_tokens} loss tokens"
              f"{'; loss tokens in green' if color else '; loss tokens between ⟦ ⟧'}) ---")
        print(text[: o.preview_chars] + (" […]" if cut else ""))
    return 0


# -- regenerate ------------------------------------------------------------------------------------


def add_regenerate_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, RegenerateOptions, title="regenerate (one pass: --extract-to with --layers/--algo/--dtype/"
                     "--extract-max-length)", keep_defaults=True)


def run_regenerate(args: argparse.Namespace) -> int:
    from engine.data.answers.dataset import regenerate_dataset

    result = regenerate_dataset(options_from_args(args, RegenerateOptions))
    reporter().update("done", 1.0, **{k: v for k, v in result.to_json().items() if not isinstance(v, dict)})
    print(json.dumps(result.to_json(), indent=2))
    return 0


# -- extract ---------------------------------------------------------------------------------------


def add_extract_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, ExtractOptions, title="extract", keep_defaults=True)
    p.add_argument("--verify", action="store_true", help="then check every file fully, as `check --full` does")


def run_extract(args: argparse.Namespace) -> int:
    from engine.data.extract.dataset import extract_dataset

    options = options_from_args(args, ExtractOptions)
    manifest = extract_dataset(options)
    reporter().update(f"extracted {manifest['samples']} samples", 1.0, samples=manifest["samples"],
                      tokens=manifest["tokens"], out=options.out)
    print(json.dumps(manifest, indent=2))
    if args.verify:
        from engine.commands.check import run as run_check

        return run_check(argparse.Namespace(data=options.out, full=True, json=False))
    return 0
