"""`recipe NAME`: run a named recipe from configs/ (data, extraction, training, benchmark, curve, k sweep, ship)."""

from __future__ import annotations

import argparse

from engine.commands.flags import add_model_fields, options_from_args
from engine.recipes.options import RecipeOptions
from engine.recipes.spec import CONFIGS


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = ", ".join(sorted(f.stem for f in CONFIGS.glob("*.yaml"))) or "none yet"
    p.add_argument("name", help=f"recipe name in configs/ ({names}) or a YAML path")
    add_model_fields(p, RecipeOptions, skip=("name",), keep_defaults=True, title="recipe")


def run(args: argparse.Namespace) -> int:
    from engine.recipes.recipe import run_recipe

    o = options_from_args(args, RecipeOptions)
    only = o.steps()
    if o.remeasure:
        from engine.recipes.recipe import remeasure
        from engine.recipes.spec import load_recipe

        done = remeasure(load_recipe(o.name), only=only, force=o.force, dry_run=o.dry_run)
        if o.dry_run:
            print("\n".join(["would re-measure " + done["draft"] + ":", *done["commands"]]))
            return 0
        print(f"re-measured {done['draft']}; card {done['card']}; records {done['records']}")
        return 0
    result = run_recipe(o.name, only=only, force=o.force, dry_run=o.dry_run)
    if o.dry_run:
        import yaml

        from engine.recipes.spec import load_recipe, resolved_steps

        steps = {s: o for s, o in resolved_steps(load_recipe(o.name)).items() if not only or s in only}
        print("resolved options (defaults filled in):\n" + yaml.safe_dump(steps, sort_keys=False))
        return 0
    print(f"\nrecipe done: {result['work']} {result['timings']}")
    return 0
