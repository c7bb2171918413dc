"""A recipe file: where recipes live, how one is read and checked, and the steps and CLI commands it stands for."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.data.options import ExtractOptions, LayerChoice, RegenerateOptions
from engine.errors import WorkbenchError, validation_summary
from engine.format.config import refuse_bad_numbers
from engine.measure.options import BenchOptions
from engine.targets.resolve import DEFAULT_TARGET
from engine.train.config import TrainConfig

_BENCH = BenchOptions.model_fields  # the sweep's stopping rule: bench --ks's fields, their defaults and help

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


class CurveStep(BaseModel):
    """`curve:`: acceptance of every kept checkpoint against the training tokens it had seen."""

    model_config = ConfigDict(extra="forbid")
    prompts: str = Field("sharegpt", description="dataset whose held-out prompts the target answers once")
    num_prompts: int = Field(10, ge=1, description="held-out prompts")
    max_new_tokens: int = Field(64, ge=1, description="answer length")
    k: int = Field(3, ge=1, description="draft tokens per step")
    dtype: str = Field("auto", description="target dtype, as `bench --dtype`")


class SweepStep(BaseModel):
    """`sweep:`: acceptance length and wall-clock speedup of the trained draft for each k."""

    model_config = ConfigDict(extra="forbid")
    prompts: str = Field("sharegpt", description="dataset whose held-out prompts are decoded")
    num_prompts: int = Field(10, ge=1, description="held-out prompts")
    max_new_tokens: int = Field(128, ge=1, description="tokens generated per prompt")
    ks: list[int] = Field([1, 2, 3, 4, 5], description="k values measured")
    dtype: str = Field("auto", description="target dtype, as `bench --dtype`")
    tolerance: float = Field(_BENCH["tolerance"].default, gt=0, description=_BENCH["tolerance"].description)
    budget_min: float = Field(_BENCH["budget_min"].default, gt=0, description=_BENCH["budget_min"].description)
    max_rounds: int = Field(_BENCH["max_rounds"].default, ge=1, description=_BENCH["max_rounds"].description)


class EvaluateStep(BaseModel):
    """`evaluate:`: decoding-exact acceptance of the trained draft per k (`python -m engine evaluate`)."""

    model_config = ConfigDict(extra="forbid")
    prompts: str = Field("sharegpt", description="dataset whose held-out prompts the target answers (--dataset)")
    num_prompts: int = Field(20, ge=1, description="held-out prompts")
    max_new_tokens: int = Field(128, ge=1, description="answer length")
    ks: list[int] | None = Field(None, description="k values (default: 1..max(5, the draft's k))")
    forecast: bool = Field(True, description="measure the step costs here and forecast the speedup")
    dtype: str = Field("auto", description="target dtype, as `evaluate --dtype`")


class ShipStep(BaseModel):
    """`ship:`: where the trained draft and its model card go."""

    model_config = ConfigDict(extra="forbid")
    to: str = Field(description="the shipped draft folder (e.g. assets/drafts/NAME)")


class Recipe(BaseModel):
    """A recipe file, checked: every key known, every step's options those of the command it runs."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the recipe's name (default: the file's stem)")
    work: str = Field(description="work folder (default: runs/recipes/NAME)")
    target: str = Field(DEFAULT_TARGET, description="target of every step")
    description: str | None = None
    data: str | None = Field(None, description="another recipe whose regenerate/extract steps this one shares")
    goals: dict[str, Any] | None = Field(None, description="the model card's bars (acceptance, speedups)")
    keep_regenerated: bool | str = Field(False, description="keep regenerated rows in the repository (or a folder)")
    kept_as: str | None = Field(None, description="name the kept rows are shared under (default: the recipe's)")
    regenerate: dict[str, Any] | None = Field(None, description="`regenerate` options, plus `onepass: true`")
    extract: dict[str, Any] | None = Field(None, description="`extract` options")
    train: dict[str, Any] | None = Field(None, description="`train` options (TrainConfig)")
    bench: dict[str, Any] | None = Field(None, description="`bench` options")
    vllm_bench: dict[str, Any] | None = Field(None, description="`bench --backend vllm` options")
    curve: CurveStep | None = None
    sweep: SweepStep | None = None
    evaluate: EvaluateStep | None = None
    ship: ShipStep | None = None

    def as_dict(self) -> dict[str, Any]:
        """The recipe as the steps read it: sections as written (their argv is what a step's marker records),
        the measurement sections with their defaults filled, absent keys left out."""
        out = self.model_dump(exclude_none=True)
        for key in ("regenerate", "extract", "train", "bench", "vllm_bench"):
            if getattr(self, key) is not None:
                out[key] = dict(getattr(self, key))
        return out


def _section_models() -> dict[str, tuple[type[BaseModel], dict[str, Any], set[str]]]:
    """Step -> (the options model its section is checked with, values the recipe fills, keys only recipes have)."""
    return {"regenerate": (RegenerateOptions, {"out": "-"}, {"onepass"}),
            "extract": (ExtractOptions, {"out": "-"}, set()),
            "train": (TrainConfig, {"data": "-"}, set()),
            "bench": (BenchOptions, {}, set()),
            "vllm_bench": (BenchOptions, {}, set())}


def _unknown_key_error(where: str, section: str, key: str, known) -> WorkbenchError:
    close = difflib.get_close_matches(key, list(known), n=1)
    return WorkbenchError(f"unknown key '{key}' in the recipe's {section}" + (f" (did you mean '{close[0]}'?)"
                          if close else ""), where=where, hint=f"known keys: {', '.join(sorted(known))}")


def _check_section(path: str, step: str, section: dict[str, Any]) -> None:
    """Refuse a key the step's command does not know, and values its options model refuses."""
    model, filled, own = _section_models()[step]
    filled = {} if "online_dataset" in section else filled  # the recipe fills `data` for offline training
    known = set(model.model_fields) | own
    if model.__name__ == "TrainConfig":
        from engine.algos import ALGOS

        known |= {f for name in ALGOS.names() for f in ALGOS.get(name).args_class.model_fields}
    for key in section:
        if key not in known:
            raise _unknown_key_error(path, f"{step}: section", key, known)
    try:
        model.model_validate({**filled, **{k: v for k, v in section.items() if k not in own}})
    except ValidationError as exc:
        raise WorkbenchError(f"the recipe's {step}: section is invalid: {validation_summary(exc)}", where=path,
                             hint=f"see `python -m engine {STEP_COMMANDS.get(step, step)} --help`") from None


def read_recipe(name_or_path: str) -> Recipe:
    """The recipe file, validated: an unknown or misspelt key is refused with the known ones."""
    path = find_recipe(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise WorkbenchError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise WorkbenchError(f"{path} must be a mapping of recipe keys, not a {type(raw).__name__}",
                             hint="see configs/*.yaml for the layout")
    refuse_bad_numbers(raw, str(path))  # YAML reads .nan and .inf as numbers
    raw.setdefault("name", path.stem)
    raw.setdefault("work", f"runs/recipes/{raw['name']}")
    for key in raw:
        if key not in Recipe.model_fields:
            raise _unknown_key_error(str(path), "file", key, Recipe.model_fields)
    raw = {k: ({} if v is None and k in STEPS else v) for k, v in raw.items()}  # `evaluate:` alone: defaults
    if "data" in raw and ({"regenerate", "extract"} & set(raw)):
        raise WorkbenchError("a recipe with 'data:' (another recipe's data) cannot have its own regenerate or "
                             "extract steps", where=str(path), hint="keep one of the two")
    for step in _section_models():
        if isinstance(raw.get(step), dict):
            _check_section(str(path), step, raw[step])
    try:
        return Recipe.model_validate(raw)
    except ValidationError as exc:
        raise WorkbenchError(f"invalid recipe: {validation_summary(exc)}", where=str(path),
                             hint="see configs/*.yaml for the layout") from None


def load_recipe(name_or_path: str) -> dict[str, Any]:
    """The validated recipe as the steps read it (`Recipe.as_dict`)."""
    return read_recipe(name_or_path).as_dict()


def data_recipe(recipe: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe whose regenerate/extract steps (and data folder) this one shares, named by its `data:` key."""
    if "data" not in recipe:
        return None
    source = load_recipe(str(recipe["data"]))
    if "data" in source:
        raise WorkbenchError(f"recipe '{source['name']}' itself borrows data (data: {source['data']})",
                             hint="point 'data:' at the recipe that regenerates and extracts")
    if source["target"] != recipe["target"]:
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
    target = recipe["target"]
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
            regen.update(_onepass(recipe.get("extract") or {}), extract_to=str(work / "hidden"))
        steps.append(("regenerate", {"target": target, **regen, "out": str(work / "regenerated.jsonl")}))
    if "extract" in recipe:
        dataset = str(work / "regenerated.jsonl") if "regenerate" in recipe else recipe["extract"].get("dataset")
        extract = {"target": target, "dataset": dataset, "split": "all", **recipe["extract"],
                   "out": str(work / "hidden")}
        steps.append(("extract", {k: v for k, v in extract.items() if v is not None}))  # no dataset: the default
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


def _onepass(extract: dict[str, Any]) -> dict[str, Any]:
    """The extract step's layer settings (LayerChoice, shared by both commands) for `regenerate --extract-to`;
    its max_length is regenerate's extract_max_length (the extract step then finds its samples on disk)."""
    return {("extract_max_length" if k == "max_length" else k): v for k, v in extract.items()
            if k in LayerChoice.model_fields or k == "max_length"}


def resolved_steps(recipe: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every step's options with the defaults filled in, as the step will run them (`recipe --dry-run` prints them)."""
    models, out = _section_models(), {}
    for step, opts in step_options(recipe):
        values = {k: v for k, v in opts.items() if k != "json"}  # where a bench writes its record
        out[step] = models[step][0].model_validate(values).model_dump(mode="json")
    for step in ("curve", "sweep", "evaluate", "ship"):
        if step in recipe:
            out[step] = recipe[step]
    return out


def step_commands(recipe: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(step, the equivalent `python -m engine` argv) in order."""
    return [(step, [STEP_COMMANDS.get(step, step), *cli_flags(opts)]) for step, opts in step_options(recipe)]


STEP_COMMANDS = {"vllm_bench": "bench"}  # recipe steps that are another CLI command with other options
