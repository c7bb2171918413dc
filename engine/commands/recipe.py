"""`recipe NAME`: run a named recipe from configs/ (data, extraction, training, benchmark, curve, k sweep, ship)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.recipes.spec import CONFIGS, STEPS

    names = ", ".join(sorted(f.stem for f in CONFIGS.glob("*.yaml"))) or "none yet"
    p.add_argument("name", help=f"recipe name in configs/ ({names}) or a YAML path")
    p.add_argument("--only", default=None,
                   help=f"comma-separated steps to run ({','.join(STEPS)})")
    p.add_argument("--force", action="store_true",
                   help="re-run steps (and measure the curve, sweep and evaluate records again) even if they completed "
                        "with the same arguments")
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands and every step's resolved options (defaults filled in; also with "
                        "--remeasure); nothing is written")
    p.add_argument("--remeasure", action="store_true",
                   help="measure the recipe's shipped draft again (bench, vllm_bench, sweep, evaluate; --only picks) "
                        "and update those figures in its model card in place: for a changed engine or lost records")


def run(args: argparse.Namespace) -> int:
    from engine.recipes.recipe import run_recipe

    only = [s.strip() for s in args.only.split(",")] if args.only else None
    if args.remeasure:
        from engine.recipes.recipe import remeasure
        from engine.recipes.spec import load_recipe

        done = remeasure(load_recipe(args.name), only=only, force=args.force, dry_run=args.dry_run)
        if args.dry_run:
            print("\n".join(["would re-measure " + done["draft"] + ":", *done["commands"]]))
            return 0
        print(f"re-measured {done['draft']}; card {done['card']}; records {done['records']}")
        return 0
    result = run_recipe(args.name, only=only, force=args.force, dry_run=args.dry_run)
    if args.dry_run:
        import yaml

        from engine.recipes.spec import load_recipe, resolved_steps

        steps = {s: o for s, o in resolved_steps(load_recipe(args.name)).items() if not only or s in only}
        print("resolved options (defaults filled in):\n" + yaml.safe_dump(steps, sort_keys=False))
        return 0
    print(f"\nrecipe done: {result['work']} {result['timings']}")
    return 0
