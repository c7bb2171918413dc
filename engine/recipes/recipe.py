"""Named recipes: YAML files of steps (regenerate, extract, train, bench, curve, sweep, ship), run in order, resumable.

Every step calls the engine function behind the CLI command a user would type (the command is printed); a step
whose options did not change since it last completed is skipped, so a recipe can be stopped and re-run (also
across sessions).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.algos import ALGOS, default_algo
from engine.algos.loading import draft_algorithm
from engine.data.answers import kept as kept_rows
from engine.data.answers.dataset import regenerate_dataset
from engine.data.extract.dataset import extract_dataset
from engine.data.options import ExtractOptions, RegenerateOptions
from engine.data.prompts.load import load_prompts
from engine.data.store.files import read_manifest
from engine.errors import WorkbenchError
from engine.format.checkpoint import load_state_dict, read_config_dict, save_checkpoint, tensor_index, weights_sha256
from engine.format.repair import EMBED
from engine.format.validate import validate_draft
from engine.fsutil import atomic_write_json, claim_names, read_json, release_names
from engine.generate.kernel_choice import load_decode_target
from engine.jobs import read_jsonl, reporter
from engine.measure.bench import benchmark
from engine.measure.evaluate import evaluate_draft, evaluate_samples, held_out_answers
from engine.measure.options import BenchOptions, EvaluateOptions
from engine.measure.speed import speed_per_k
from engine.provenance import engine_command, provenance, rows_of
from engine.recipes.model_card import data_rows, refresh_measurements, write_evaluation_section, write_model_card
from engine.recipes.spec import STEP_COMMANDS, STEPS, cli_flags, data_recipe, load_recipe, step_options
from engine.targets.dtypes import dtype_name
from engine.train import trainer
from engine.train.config import TrainConfig
from engine.weightfiles import INDEX_NAME, weight_files

log = logging.getLogger(__name__)


def _run_regenerate(opts: dict[str, Any]) -> None:
    regenerate_dataset(RegenerateOptions(**opts))


def _run_extract(opts: dict[str, Any]) -> None:
    extract_dataset(ExtractOptions(**opts))


def _run_train(opts: dict[str, Any]) -> None:
    trainer.train(TrainConfig.model_validate(opts))


def _run_bench(opts: dict[str, Any], **record: Any) -> None:
    """`bench` with the recipe's options; `record` fields (e.g. the weights it measured) go into its JSON too."""
    opts = dict(opts)
    out = opts.pop("json")
    result = benchmark(BenchOptions(**opts))
    result["command"] = engine_command(["bench", *cli_flags(opts)])
    atomic_write_json(out, {**result, **record})


STEP_FUNCTIONS = {"regenerate": _run_regenerate, "extract": _run_extract, "train": _run_train, "bench": _run_bench,
                  "vllm_bench": _run_bench}


def _digest(argv: list[str]) -> str:
    return hashlib.sha256(json.dumps(argv).encode()).hexdigest()[:16]


def _inputs(step: str, opts: dict[str, Any]) -> dict[str, int]:
    """How much data a step read that an earlier step wrote (rows of the regenerated JSONL, samples of the hidden
    states): when a recipe's data grows, the steps that read it run again (and resume on what they already did)."""
    if step == "extract" and opts.get("dataset") and Path(opts["dataset"]).is_file():
        with open(opts["dataset"], "rb") as f:
            return {"dataset_rows": sum(1 for line in f if line.strip())}
    if step == "train" and opts.get("data") and Path(opts["data"]).is_dir():
        manifest = read_manifest(Path(opts["data"])) or {}
        return {"data_samples": int(manifest.get("samples", 0))}
    return {}


def _still_done(marker: dict[str, Any], digest: str, inputs: dict[str, int]) -> bool:
    """Same options, and the same amount of input data (a marker from before inputs were recorded counts as same)."""
    recorded = marker.get("inputs") or {}
    return marker.get("digest") == digest and all(recorded.get(k, v) == v for k, v in inputs.items())


# What recipe steps write into a recipe's work folder (each step's own output checks its own folder as well).
WORK_FILES = ("steps", "regenerated.jsonl", "hidden", "train", "bench.json", "vllm_bench.json", "curve.json",
              "sweep.json", "evaluate.json", "remeasure")


def _kept_folder(recipe: dict[str, Any]) -> Path | None:
    """Where the recipe keeps its regenerated rows in the repository (`keep_regenerated: true` or a folder)."""
    value = recipe.get("keep_regenerated")
    return None if not value else kept_rows.KEPT_DIR if value is True else Path(value)


def _kept_name(recipe: dict[str, Any]) -> str:
    """The name its regenerated rows are kept under: `kept_as:` (rows shared by recipes whose regenerate settings are
    the same; `seed` checks that) or the recipe's own name."""
    return str(recipe.get("kept_as") or recipe["name"])


def claim_work(work: Path, names=WORK_FILES) -> None:
    """Refuse a work folder holding a file of the user's under a name the steps write; record the names as ours."""
    claim_names(work, names, kind="recipe-work", what="recipe work folder", flag="the recipe's `work:`")


def run_recipe(name_or_path: str, *, only: list[str] | None = None, force: bool = False, dry_run: bool = False) -> dict:
    recipe = load_recipe(name_or_path)
    unknown = sorted(set(only or []) - set(STEPS))
    if unknown:  # a misspelt step would otherwise run nothing and say "recipe done"
        raise WorkbenchError(f"unknown recipe step(s) {unknown} in --only", hint=f"steps are {','.join(STEPS)}")
    work = Path(recipe["work"])
    done_dir = work / "steps"
    timings: dict[str, float] = {}
    steps = [(s, o) for s, o in step_options(recipe) if not only or s in only]
    source = data_recipe(recipe)
    if not dry_run:  # a dry run writes nothing
        for folder in {work, Path((source or recipe)["work"])}:
            claim_work(folder)
    rep = reporter()
    for i, (step, opts) in enumerate(steps):
        argv = [step, *cli_flags(opts)]
        shown = [STEP_COMMANDS.get(step, step), *argv[1:]]
        shared = source is not None and step in ("regenerate", "extract")  # its marker lives with the data
        marker = (Path(source["work"]) / "steps" if shared else done_dir) / f"{step}.json"
        digest, inputs = _digest(argv), _inputs(step, opts)
        if not force and marker.is_file() and _still_done(read_json(marker), digest, inputs):
            log.info("step %s: already done (%s)", step, marker)
            continue
        log.info("== %s: python -m engine %s", step, " ".join(shown))
        if dry_run:
            continue
        rep.update(f"recipe step {step}", i / max(1, len(steps)))
        kept = _kept_folder(source or recipe) if step == "regenerate" else None
        kept_name = _kept_name(source or recipe)
        seeded = 0
        if kept is not None:  # rows regenerated on other machines with these settings are not paid again

            seeded = kept_rows.seed(kept_name, opts["out"], opts, kept, ids=kept_rows.selection_ids(opts))
        t = time.time()
        STEP_FUNCTIONS[step](opts)
        timings[step] = time.time() - t
        if kept is not None:

            kept_rows.keep(kept_name, opts["out"], opts, kept)
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(marker, {"digest": digest, "argv": argv, "inputs": inputs, "seconds": timings[step],
                                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                   **({"seeded_rows": seeded} if seeded else {}),
                                   **provenance(_step_dtype(opts), command=engine_command(shown))})
    if "curve" in recipe and (not only or "curve" in only) and not dry_run:
        rep.update("recipe step curve")
        acceptance_curve(recipe, force=force)
    if "sweep" in recipe and (not only or "sweep" in only) and not dry_run:
        rep.update("recipe step sweep")
        k_sweep(recipe, force=force)
    if "evaluate" in recipe and (not only or "evaluate" in only) and not dry_run:
        rep.update("recipe step evaluate")
        evaluate_step(recipe, force=force)
    if "ship" in recipe and (not only or "ship" in only) and not dry_run:
        ship(recipe)
    return {"work": str(work), "timings": timings}


def _step_dtype(opts: dict[str, Any]) -> str:
    """The dtype a step ran in, as its options say (a training step's precision; "auto" where left to the engine)."""
    return str(opts.get("dtype") or opts.get("precision") or "auto")


def recipe_command(recipe: dict[str, Any], step: str, *, remeasure: bool = False) -> str:
    """The command that measures one of a recipe's records (curve, sweep, evaluate): `recipe NAME --only STEP`."""
    name = recipe.get("name") or recipe["work"]
    return engine_command(["recipe", name, *(["--remeasure"] if remeasure else []), "--only", step])


def _write_rows(path: Path, rows: list[dict[str, Any]], command: str, dtype: str) -> None:
    atomic_write_json(path, {**provenance(dtype, command=command), "rows": rows})


def acceptance_curve(recipe: dict[str, Any], *, force: bool = False) -> list[dict[str, Any]]:
    """Decoding-exact mean acceptance length (engine.generate.acceptance's walk) of every kept checkpoint vs the
    training tokens it had seen: the target answers the held-out prompts once (engine.measure.answers keeps them for
    the next curve or evaluation), then each checkpoint costs one draft pass.
    (The recipe's `bench` step decodes for real with the final draft: the cross-check.)"""
    work = Path(recipe["work"])
    opts = recipe["curve"]
    out_file = work / "curve.json"
    done = {row["step"]: row for row in (rows_of(read_json(out_file)) if out_file.is_file() and not force else [])}
    rows = [r for r in read_jsonl(work / "train" / "metrics.jsonl") if r.get("split") == "train"]
    checkpoints = {int(c.name.split("_")[1]): c for c in sorted((work / "train" / "checkpoints").glob("step_*"))}
    # a row measured on other weights (the run was trained again) is measured again
    done = {s: r for s, r in done.items() if s in checkpoints and r.get("weights") == _stamp(checkpoints[s])}
    seen, tokens_at = 0.0, {0: 0.0}
    for r in rows:
        seen += r.get("tokens", 0.0)
        tokens_at[r["step"]] = seen
    todo = [s for s in checkpoints if s not in done]
    if todo:
        target = load_decode_target(recipe["target"], opts["dtype"])
        prompts = load_prompts(opts["prompts"], opts["num_prompts"])
        max_new, k = opts["max_new_tokens"], opts["k"]
        algorithm = draft_algorithm(checkpoints[todo[0]])
        first = algorithm.load(checkpoints[todo[0]], target)
        samples = held_out_answers(target, prompts, algorithm.aux_layer_ids(first), max_new)  # kept answers
    for step in todo:
        ckpt = checkpoints[step]
        result = evaluate_samples(algorithm, algorithm.load(ckpt, target), samples, [k],
                                  EvaluateOptions(max_new_tokens=max_new))
        row = result["by_k"][str(k)]
        done[step] = {"step": step, "weights": _stamp(ckpt), "training_tokens": tokens_at.get(step, 0.0),
                      "mean_acceptance_length": row["mean_acceptance_length"],
                      "per_position_acceptance": row["per_position_acceptance"],
                      "all_positions_acceptance_length": row["all_positions_acceptance_length"],
                      "measured_by": "decoding walk (engine.measure.evaluate)"}
        log.info("curve: step %d (%.0f tokens) -> acceptance length %.2f", step, done[step]["training_tokens"],
                 row["mean_acceptance_length"] or 0)
        _write_rows(out_file, [done[k] for k in sorted(done)], recipe_command(recipe, "curve"),
                    dtype_name(target.dtype))
    return [done[k] for k in sorted(done)]


def _stamp(folder: Path) -> str:
    """Identifies the weights in a draft or checkpoint folder (size and modification time of its safetensors)."""
    return "+".join(f"{st.st_size}-{st.st_mtime_ns}" for st in (f.stat() for f in weight_files(folder)))


def k_sweep(recipe: dict[str, Any], *, draft: Path | None = None, out_file: Path | None = None,
            force: bool = False, command: str | None = None) -> dict[str, Any]:
    """One speed per k of the trained draft (or `draft`): every k, n-gram and the baseline decoded in one
    interleaved run, rounds repeated until the intervals are narrow (engine.measure.speed); the record (rows per k,
    and bench's `methods` at the recipe's k) names `command` (default: the recipe's sweep step). A record of the
    same weights is kept unless `force`."""
    work = Path(recipe["work"])
    opts = recipe["sweep"]
    out_file = out_file or work / "sweep.json"
    draft = draft or work / "train" / "draft"
    old = read_json(out_file) if out_file.is_file() and not force else {}
    if isinstance(old, dict) and old.get("weights") == _stamp(draft) and old.get("rounds_kept"):
        return old
    target = load_decode_target(recipe["target"], opts["dtype"])
    prompts = load_prompts(opts["prompts"], opts["num_prompts"])
    k = (recipe.get("bench") or {}).get("k", 3)
    options = BenchOptions(methods="baseline,draft,ngram", draft=str(draft), k=k, ks=",".join(map(str, opts["ks"])),
                           max_new_tokens=opts["max_new_tokens"], tolerance=opts["tolerance"],
                           budget_min=opts["budget_min"], max_rounds=opts["max_rounds"])
    result = speed_per_k(target, prompts, options)
    for row in result["rows"]:
        row.update(num_prompts=len(prompts), max_new_tokens=options.max_new_tokens)
        log.info("sweep: k=%d -> acceptance length %.2f, speedup %.2fx (%s)", row["k"],
                 row["mean_acceptance_length"] or 0, row["speedup"] or 0, row["spread"]["ci95"])
    record = {**result, "command": command or recipe_command(recipe, "sweep"), "weights": _stamp(draft),
              "draft_sha256": weights_sha256(draft)}  # which weights: the app credits no other draft with them
    atomic_write_json(out_file, record)
    return record


def evaluate_step(recipe: dict[str, Any], *, draft: Path | None = None, out_file: Path | None = None,
                  force: bool = False, command: str | None = None) -> dict[str, Any]:
    """Decoding-exact acceptance of the trained draft (or `draft`) for every k, with the speedup forecast; the
    record names `command` (default: the recipe's evaluate step)."""
    work = Path(recipe["work"])
    opts = recipe["evaluate"]
    draft = draft or work / "train" / "draft"
    out_file = out_file or work / "evaluate.json"
    if not force and out_file.is_file() and read_json(out_file).get("weights") == _stamp(draft):
        return read_json(out_file)
    options = EvaluateOptions(draft=str(draft), target=recipe["target"], dataset=opts["prompts"],
                              num_prompts=opts["num_prompts"], max_new_tokens=opts["max_new_tokens"], k=opts["ks"],
                              forecast=opts["forecast"], dtype=opts["dtype"])
    result = evaluate_draft(options, progress=False)
    result["weights"] = _stamp(draft)
    result["command"] = command or recipe_command(recipe, "evaluate")
    atomic_write_json(out_file, result)
    return result


REMEASURE_STEPS = ("bench", "vllm_bench", "sweep", "evaluate")


def remeasure(recipe: dict[str, Any], *, only: list[str] | None = None, force: bool = False,
              dry_run: bool = False) -> dict[str, Any]:
    """Measure the shipped draft (`ship: to:`) again with the recipe's bench, vllm_bench, sweep and evaluate
    settings, into <work>/remeasure/, and put the new figures into its model card in place.

    For when the engine changed (a faster step, a new dtype) or the training records are gone: the draft and the
    card's training sections stay; a record measured on the same weights is reused unless `force`.
    `dry_run` only says what would be measured (into `commands`) and writes nothing."""
    shipped = Path(recipe.get("ship", {}).get("to", ""))
    if not (shipped / "config.json").is_file():
        raise WorkbenchError(f"recipe '{recipe['name']}' has no shipped draft to re-measure at '{shipped}'",
                             hint="run the recipe to the end first (its ship step writes the draft)")
    steps = [s for s in (only or REMEASURE_STEPS) if s in recipe]
    bad = sorted(set(only or []) - set(REMEASURE_STEPS))
    if bad:
        raise WorkbenchError(f"cannot re-measure {bad}", hint=f"choose from {list(REMEASURE_STEPS)}")
    out = Path(recipe["work"]) / "remeasure"
    stamp, target = _stamp(shipped), recipe["target"]
    if dry_run:
        return {"draft": str(shipped), "dry_run": True,
                "commands": [_remeasure_command(recipe, step, shipped, out, target) for step in steps]}
    claim_work(Path(recipe["work"]), ["remeasure"])
    claim_work(out, [f"{step}.json" for step in REMEASURE_STEPS])
    claim_names(shipped, ["README.md"], kind="shipped-draft", what="shipped draft", flag="the recipe's `ship: to:`")
    records: dict[str, Any] = {}
    for step in steps:
        file = out / f"{step}.json"
        if step in ("bench", "vllm_bench"):
            old = read_json(file) if file.is_file() else {}
            if force or old.get("weights") != stamp:
                log.info("re-measure %s: %s", step, _remeasure_command(recipe, step, shipped, out, target))
                _run_bench(_remeasure_bench_options(recipe, step, shipped, out, target), weights=stamp)
            records[step] = read_json(file)
        elif step == "sweep":
            records[step] = k_sweep(recipe, draft=shipped, out_file=file, force=force,
                                    command=recipe_command(recipe, step, remeasure=True))
        else:
            records[step] = evaluate_step(recipe, draft=shipped, out_file=file, force=force,
                                          command=recipe_command(recipe, step, remeasure=True))
    card = shipped / "README.md"
    # records not measured now, kept from an earlier re-measurement: the card's vLLM table (and its goal) stay as
    # measured; the bench and the sweep are read together, so that the card quotes one speed per k
    kept = {step: read_json(out / f"{step}.json") for step in ("bench", "vllm_bench", "sweep")
            if step not in records and (out / f"{step}.json").is_file()}
    bench = records.get("bench") or (kept.get("bench") if "sweep" in records else None)
    refresh_measurements(card, recipe, bench=bench, vllm_bench=records.get("vllm_bench"),
                         vllm_goals=records.get("vllm_bench") or kept.get("vllm_bench"),
                         model_lines=_shipped_model_lines(recipe, shipped), sweep=records.get("sweep") or
                         kept.get("sweep"), data=data_rows(target) if "evaluate" in records else None)
    if records.get("evaluate"):
        write_evaluation_section(card, records["evaluate"], rows_of(records["sweep"]) if "sweep" in records else None)
    log.info("re-measured %s: %s", shipped, ", ".join(records))
    return {"draft": str(shipped), "card": str(card), "records": {k: str(out / f"{k}.json") for k in records}}


def _shipped_model_lines(recipe: dict[str, Any], shipped: Path) -> list[str]:
    """The card's model bullets for the shipped files as they are now (a draft repaired after training stores its
    embedding: the card says so), from the recipe's training arguments and the checkpoint's tensors."""
    train = recipe.get("train") or {}
    algo = ALGOS.get(train.get("algo") or default_algo())
    fields = {**train, **(train.get("algo_args") or {})}
    args = algo.args_class.model_validate({k: v for k, v in fields.items() if k in algo.args_class.model_fields})
    if "save_embeddings" in algo.args_class.model_fields:
        args.save_embeddings = "embed_tokens.weight" in tensor_index(shipped)
    return algo.card_model_lines(read_config_dict(shipped), args)


def _remeasure_bench_options(recipe: dict[str, Any], step: str, shipped: Path, out: Path, target: str) -> dict:
    opts = {"target": target, "draft": str(shipped), **recipe[step], "json": str(out / f"{step}.json")}
    return {**opts, "backend": "vllm"} if step == "vllm_bench" else opts


def _remeasure_command(recipe: dict[str, Any], step: str, shipped: Path, out: Path, target: str) -> str:
    """What `remeasure` runs for `step`, as words (a command line for the benches)."""
    if step in ("bench", "vllm_bench"):
        return engine_command(["bench", *cli_flags(_remeasure_bench_options(recipe, step, shipped, out, target))])
    return f"{step} of {shipped} with {recipe[step]} into {out / f'{step}.json'}"


def _weight_names(folder: Path) -> set[str]:
    """The names of the weight files in a draft folder (shard index and safetensors files)."""
    return {p.name for p in folder.glob("*.safetensors")} | ({INDEX_NAME} if (folder / INDEX_NAME).exists() else set())


def ship(recipe: dict[str, Any]) -> Path:
    """Write the trained draft (bf16 config + safetensors) into the shipped location, the verifier's embedding (when
    the draft stores it) in a shard of its own: the same bytes in every re-ship, so git keeps one copy of it."""
    src = Path(recipe["work"]) / "train" / "draft"
    dest = Path(recipe["ship"]["to"])

    def claim(names: set[str]) -> None:  # only what an earlier ship wrote is replaced or removed
        claim_names(dest, names, kind="shipped-draft", what="ship destination", flag="the recipe's `ship: to:`")

    previous = _weight_names(dest)
    claim({"config.json", "README.md"} | previous)
    report = validate_draft(src)
    if not report.ok:
        raise WorkbenchError(f"the trained draft does not validate: {[e.message for e in report.errors]}")
    with tempfile.TemporaryDirectory(prefix=".ship-", dir=dest.parent) as tmp:
        staged = save_checkpoint(Path(tmp) / "draft", read_config_dict(src), load_state_dict(src),
                                 own_shards=[EMBED])
        written = {"config.json"} | _weight_names(staged)
        claim(written)
        for name in sorted(written):
            os.replace(staged / name, dest / name)
    stale = previous - written  # the previous ship's layout (one model.safetensors before the embedding's shard)
    for name in stale:
        (dest / name).unlink()
    release_names(dest, stale)

    write_model_card(recipe, dest)
    log.info("shipped %s -> %s", src, dest)
    return dest
