"""A recipe file: where recipes live, how one is read and checked, and the steps and CLI commands it stands for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from engine.errors import WorkbenchError
from engine.format.config import refuse_bad_numbers

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STEPS = ("regenerate", "extract", "train", "bench", "vllm_bench", "curve", "sweep", "evaluate", "ship")


def find_recipe(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    candidate = CONFIGS / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    names = sorted(f.stem for f in CONFIGS.glob("*.yaml"))
    raise WorkbenchError(f"no recipe '{name_or_path}'", hint=f"choose one of {names} or give a YAML path")


def load_recipe(name_or_path: str) -> dict[str, Any]:
    path = find_recipe(name_or_path)
    try:
        recipe = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise WorkbenchError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(recipe, dict):
        raise WorkbenchError(f"{path} must be a mapping of recipe keys, not a {type(recipe).__name__}",
                             hint="see configs/*.yaml for the layout")
    refuse_bad_numbers(recipe, str(path))  # YAML reads .nan and .inf as numbers
    recipe.setdefault("name", path.stem)
    recipe.setdefault("work", f"runs/recipes/{recipe['name']}")
    known = {"name", "work", "target", "description", "data", "goals", "keep_regenerated", "kept_as"}
    unknown = set(recipe) - set(STEPS) - known
    if unknown:
        raise WorkbenchError(f"unknown recipe keys {sorted(unknown)}", where=str(path),
                             hint=f"steps are {list(STEPS)}")
    if "data" in recipe and ({"regenerate", "extract"} & set(recipe)):
        raise WorkbenchError("a recipe with 'data:' (another recipe's data) cannot have its own regenerate or "
                             "extract steps", where=str(path), hint="keep one of the two")
    return recipe


def data_recipe(recipe: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe whose regenerate/extract steps (and data folder) this one shares, named by its `data:` key."""
    if "data" not in recipe:
        return None
    source = load_recipe(str(recipe["data"]))
    if "data" in source:
        raise WorkbenchError(f"recipe '{source['name']}' itself borrows data (data: {source['data']})",
                             hint="point 'data:' at the recipe that regenerates and extracts")
    if source.get("target", "smollm2-135m-instruct") != recipe.get("target", "smollm2-135m-instruct"):
        raise WorkbenchError(f"recipe '{source['name']}' extracts hidden states of another target",
                             hint="share data only between recipes of the same target")
    return source


def cli_flags(options: dict[str, Any]) -> list[str]:
    """Step options as `python -m engine` flags (nested dicts flattened, booleans as --x / --no-x)."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, dict):  # nested options (a training config's algo_args) are flat flags on the CLI
            argv += cli_flags(value)
        elif isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def data_work(recipe: dict[str, Any]) -> Path:
    """The folder holding the recipe's regenerated.jsonl, hidden/ and data step markers (its own or the lender's)."""
    source = data_recipe(recipe)
    return Path((source or recipe)["work"])


def step_options(recipe: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(step, options of the engine function it calls) in order, with the recipe's paths filled in.

    A recipe with `data: <other recipe>` runs that recipe's regenerate and extract steps (skipped when already
    done there) and trains on its hidden states."""
    work = Path(recipe["work"])
    target = recipe.get("target", "smollm2-135m-instruct")
    source = data_recipe(recipe)
    steps: list[tuple[str, dict[str, Any]]] = []
    if source is not None:
        steps = [(s, o) for s, o in step_options(source) if s in ("regenerate", "extract")]
        work_data = Path(source["work"]) / "hidden"
    else:
        work_data = work / "hidden"
    if "regenerate" in recipe:
        regen = dict(recipe["regenerate"])
        if regen.pop("onepass", False):  # the extract step's hidden states, kept while generating
            regen.update(_onepass_options(recipe.get("extract") or {}), extract_to=str(work / "hidden"))
        steps.append(("regenerate", {"target": target, **regen, "out": str(work / "regenerated.jsonl")}))
    if "extract" in recipe:
        dataset = str(work / "regenerated.jsonl") if "regenerate" in recipe else recipe["extract"].get("dataset")
        steps.append(("extract", {"target": target, "dataset": dataset, "split": "all", **recipe["extract"],
                                  "out": str(work / "hidden")}))
    if "train" in recipe:
        steps.append(("train", {"target": target, "data": str(work_data), **recipe["train"],
                                "out": str(work / "train")}))
    if "bench" in recipe:
        steps.append(("bench", {"target": target, "draft": str(work / "train" / "draft"), **recipe["bench"],
                                "json": str(work / "bench.json")}))
    if "vllm_bench" in recipe:  # the same benchmark through the managed vLLM server (the draft as vLLM serves it)
        steps.append(("vllm_bench", {"target": target, "draft": str(work / "train" / "draft"), **recipe["vllm_bench"],
                                     "backend": "vllm", "json": str(work / "vllm_bench.json")}))
    return steps


def _onepass_options(extract: dict[str, Any]) -> dict[str, Any]:
    """The extract step's settings as `regenerate --extract-to` flags (the extract step then finds its samples
    on disk and only checks them)."""
    names = {"algo": "algo", "layers": "layers", "dtype": "dtype", "max_length": "extract_max_length"}
    return {names[k]: v for k, v in extract.items() if k in names}


def step_commands(recipe: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(step, the equivalent `python -m engine` argv) in order."""
    return [(step, [STEP_COMMANDS.get(step, step), *cli_flags(opts)]) for step, opts in step_options(recipe)]


STEP_COMMANDS = {"vllm_bench": "bench"}  # recipe steps that are another CLI command with other options
