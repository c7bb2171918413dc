"""Glue for the Train page: the command line of a config, where a run writes, and the runs to chart."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from engine import jobs as engine_jobs
from engine.algos import ALGOS, AlgoArgs, algorithm_names
from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_text, read_json
from engine.targets.identity import target_for_data
from engine.targets.resolve import resolves_locally
from engine.train.config import TrainConfig
from ui.cli import flags
from ui.forms import field_kind
from ui.jobs import FIRST_RUN, argv_value

# Form sections of the fields every algorithm shares; the chosen algorithm's own arguments follow in the
# sections its arguments class names (`AlgoArgs.groups`).
GROUPS = {
    "What to train": ["target", "data", "online_dataset", "online_max_samples", "out", "init_from", "aux_layer_ids"],
    "Optimisation": ["lr", "weight_decay", "betas", "warmup_steps", "scheduler", "min_lr_ratio", "epochs",
                     "max_steps", "tokens_per_batch", "max_length", "grad_accum", "clip_grad", "precision", "seed"],
    "Validation, logging, checkpoints, device": ["val_fraction", "val_every", "val_max_batches", "log_every",
                                                 "checkpoint_every", "keep_checkpoints", "device"],
    "Several processes (torchrun)": ["strategy"],
}
# A tiny run to try the pipeline, not to get a useful draft; its duration is measured (smoke_duration).
SMOKE = {"online_dataset": "sharegpt", "online_max_samples": 24, "data": None, "max_steps": 12, "epochs": 1,
         "tokens_per_batch": 256, "max_length": 192, "warmup_steps": 2, "val_fraction": 0.2, "val_every": 4,
         "val_max_batches": 2, "log_every": 1, "checkpoint_every": 6}
COMMON_SKIP = ("algo", "algo_args")  # the algorithm is chosen by its own selector; its arguments have a form


def algorithm_title(name: str) -> str:
    return f"{ALGOS.get(name).title} ({name})" if name in ALGOS else name


def args_class(algo: str) -> type[AlgoArgs]:
    return ALGOS.get(algo).args_class


def algo_prefix(prefix: str, algo: str) -> str:
    """Widget-key prefix of one algorithm's arguments (each algorithm keeps its own values)."""
    return f"{prefix}{algo}__"


def algo_groups(algo: str) -> dict[str, list[str]]:
    """The algorithm's own form sections, plus one for the arguments they do not name."""
    algorithm = ALGOS.get(algo)
    groups = dict(algorithm.args_class.groups)
    listed = {n for names in groups.values() for n in names}
    rest = [n for n in algorithm.args_class.model_fields if n not in listed]
    if rest:
        groups[f"{algorithm.title} arguments"] = rest
    return groups


def _field_defaults(model_cls) -> dict[str, Any]:
    return {name: info.get_default(call_default_factory=True) for name, info in model_cls.model_fields.items()
            if not info.is_required() and name not in COMMON_SKIP}


def defaults() -> dict[str, Any]:
    """Defaults of the fields every algorithm shares (plus `algo`)."""
    return {**_field_defaults(TrainConfig), "algo": TrainConfig.model_fields["algo"].get_default(
        call_default_factory=True)}


def algo_defaults(algo: str) -> dict[str, Any]:
    return _field_defaults(args_class(algo))


def config_values(common: dict[str, Any], algo: str, algo_values: dict[str, Any]) -> dict[str, Any]:
    """The form's two parts as one TrainConfig input."""
    return {**{k: v for k, v in common.items() if k not in COMMON_SKIP}, "algo": algo, "algo_args": algo_values}


def default_out(name: str) -> str:
    return str(engine_jobs.runs_dir() / "train" / name)


def new_run_name() -> str:
    return "draft-" + time.strftime("%Y%m%d-%H%M%S")


def _flag_expressible(model_cls, name: str) -> bool:
    return field_kind(model_cls.model_fields[name].annotation).kind != "tuple"


def train_argv(cfg: TrainConfig) -> tuple[list[str], dict[str, Any]]:
    """(argv for `python -m engine train`, fields that only a YAML file can carry) for a validated config.

    Fields equal to their default are left out; the algorithm's arguments are flags too (`--ttt-steps 4`).
    Fields argparse cannot take (tuples such as `betas`) go into a small YAML file named with --config.
    """
    parts = [(TrainConfig, {k: v for k, v in cfg.model_dump().items() if k not in COMMON_SKIP}, defaults()),
             (type(cfg.algo_args), cfg.algo_args.model_dump(), algo_defaults(cfg.algo))]
    as_flags: dict[str, Any] = {"algo": cfg.algo} if cfg.algo != defaults()["algo"] else {}
    in_yaml: dict[str, Any] = {}
    for model_cls, values, dflt in parts:
        changed = {k: v for k, v in values.items() if k not in dflt or dflt[k] != v}
        as_flags.update({k: v for k, v in changed.items() if _flag_expressible(model_cls, k)})
        in_yaml.update({k: list(v) if isinstance(v, tuple) else v for k, v in changed.items()
                        if not _flag_expressible(model_cls, k)})
    if in_yaml and "algo" in as_flags:
        in_yaml["algo"] = cfg.algo  # a flat algorithm argument in the YAML file needs its algorithm there too
    return ["train", *flags(as_flags)], in_yaml


def launcher(nproc: int) -> list[str] | None:
    """How a run of `nproc` processes is started: torchrun on this machine (None: one plain process).

    `--standalone` gives every run its own rendezvous on a free port, so two runs never collide."""
    if nproc <= 1:
        return None
    return ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(int(nproc))]


def launch_command(argv: list[str], nproc: int) -> str:
    """The shell command of a run: `python -m engine train ...` or `torchrun ... -m engine train ...`."""
    import shlex

    return engine_jobs.launcher_command(launcher(nproc)) + " " + shlex.join([str(a) for a in argv])


def job_processes(job: engine_jobs.Job) -> int:
    """--nproc-per-node of a job's launcher (1 for a plain job)."""
    parts = job.launcher or []
    for i, a in enumerate(parts):
        if a in ("--nproc-per-node", "--nproc_per_node") and i + 1 < len(parts):
            try:
                return int(parts[i + 1])
            except ValueError:
                return 1
    return 1


def rank_progress(out: Path) -> list[dict[str, Any]]:
    """Each rank's last record (`<out>/progress/rank{r}.json`, written by the trainer), by rank."""
    rows = []
    for f in sorted(Path(out, "progress").glob("rank*.json")):
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue  # being replaced right now
    return sorted(rows, key=lambda r: r.get("rank", 0))


def progress_table(rows: list[dict[str, Any]], now: float | None = None) -> list[dict[str, Any]]:
    """Rows for the per-rank table: rank, host, state, step, epoch, micro-batch, seconds since the last update."""
    now = time.time() if now is None else now
    return [{"rank": r.get("rank"), "host": r.get("host"), "pid": r.get("pid"), "state": r.get("state"),
             "step": f"{r.get('step', 0)}/{r.get('total_steps', '?')}", "epoch": r.get("epoch"),
             "micro-batch": r.get("cursor"), "updated (s ago)": round(now - r.get("updated", now), 1)}
            for r in rows]


def write_yaml_overrides(out: str, values: dict[str, Any]) -> str:
    path = Path(out) / "train_overrides.yaml"
    atomic_write_text(path, yaml.safe_dump({"train": values}, sort_keys=False))
    return str(path)


def train_out(job: engine_jobs.Job) -> Path:
    """The folder a train job writes (checkpoints/, metrics.jsonl, draft/)."""
    out = argv_value(job, "--out")
    if out is None:
        config = argv_value(job, "--config")
        if config:
            try:
                raw = yaml.safe_load(Path(config).read_text()) or {}
                out = (raw.get("train", raw) or {}).get("out")
            except (OSError, yaml.YAMLError):
                out = None
    return Path(out or TrainConfig.model_fields["out"].default).expanduser()


def latest_checkpoint(out: Path) -> str | None:
    pointer = out / "checkpoints" / "latest"
    try:
        return pointer.read_text().strip() or None
    except OSError:
        return None


def metric_runs(max_depth: int = 4) -> dict[str, Path]:
    """Every folder under runs/ with a metrics.jsonl (train jobs, recipes), labelled by its path under runs/."""
    root = engine_jobs.runs_dir()
    found: dict[str, Path] = {}
    if not root.is_dir():
        return found
    for depth in range(1, max_depth + 1):
        for f in sorted(root.glob("/".join(["*"] * depth) + "/metrics.jsonl")):
            found[str(f.parent.relative_to(root))] = f.parent
    for job in engine_jobs.list_jobs(root):
        if job.kind == "train":
            out = train_out(job)
            if (out / "metrics.jsonl").is_file() and out not in found.values():
                found[str(out)] = out
    return found


def is_smoke_run(job: engine_jobs.Job) -> bool:
    """A train job launched with the smoke preset (its step, row and batch limits on the command line)."""
    return job.kind == "train" and all(argv_value(job, "--" + name.replace("_", "-")) == str(SMOKE[name])
                                       for name in ("max_steps", "online_max_samples", "tokens_per_batch"))


def smoke_duration(algo: str) -> tuple[float, str] | None:
    """(seconds, where measured) of the smoke preset: the latest finished smoke run of `algo` on this machine (process
    start to exit), or None before the first one (no figure measured elsewhere stands in for this machine)."""
    default_algo = defaults()["algo"]
    for job in engine_jobs.list_jobs():  # newest first
        if job.status.state == "done" and job.status.updated and is_smoke_run(job) \
                and (argv_value(job, "--algo") or default_algo) == algo:
            return job.status.updated - job.created, f"your last smoke run here ({job.id})"
    return None


SMOKE_FIRST = (f"{FIRST_RUN} (no smoke run of this algorithm on this machine yet; the first one is timed and the "
               "next estimate uses it)")


def smoke_summary(algo: str) -> str:
    """"Takes about 1 min 23 s (your last smoke run here ...)": the smoke preset's duration in one line."""
    measured = smoke_duration(algo)
    if measured is None:
        return f"Time: {SMOKE_FIRST}."
    seconds, where = measured
    return f"Takes about {engine_jobs.duration_text(seconds)} ({where}; longer on a busy machine)."


def smoke_help(algo: str) -> str:
    measured = smoke_duration(algo)
    took = (f"Measured: {engine_jobs.duration_text(measured[0])} on {measured[1]}; the time grows with the "
            "machine's load." if measured else f"Time: {SMOKE_FIRST}.")
    return (f"Online training on {SMOKE['online_max_samples']} ShareGPT rows for {SMOKE['max_steps']} steps: checks "
            f"the pipeline, does not make a useful draft. {took}")


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    return engine_jobs.read_jsonl(Path(folder) / "metrics.jsonl")


def last_row(rows: list[dict[str, Any]], split: str = "train") -> dict[str, Any] | None:
    return next((r for r in reversed(rows) if r.get("split") == split), None)


__all__ = [
    "COMMON_SKIP",
    "GROUPS",
    "algo_defaults",
    "algo_groups",
    "algo_prefix",
    "algorithm_names",
    "algorithm_title",
    "args_class",
    "config_values",
    "SMOKE",
    "SMOKE_FIRST",
    "TrainConfig",
    "default_out",
    "defaults",
    "is_smoke_run",
    "job_processes",
    "last_row",
    "launch_command",
    "launcher",
    "latest_checkpoint",
    "metric_runs",
    "new_run_name",
    "progress_table",
    "rank_progress",
    "read_metrics",
    "smoke_duration",
    "smoke_help",
    "train_argv",
    "train_out",
    "write_yaml_overrides",
]


def data_target(data: str | None) -> str | None:
    """The target an extracted hidden-states folder was made from (its manifest), when it can be loaded here."""
    manifest = Path(data or "").expanduser() / "manifest.json"
    if not data or not manifest.is_file():
        return None
    try:
        recorded = read_json(manifest)
    except (OSError, ValueError):
        return None
    for candidate in (recorded.get("target_path"), recorded.get("target")):
        if candidate and resolves_locally(candidate):
            return str(candidate)
    return None


def data_target_problem(data: str | None, target: str | None, accept_change: bool = False) -> str | None:
    """Why training on `data` with `target` would be refused (another target than the data's, or its weights
    changed), or None."""
    manifest = Path(data or "").expanduser() / "manifest.json"
    if not data or not manifest.is_file():
        return None
    try:
        target_for_data(read_json(manifest), target, where=data, accept_change=accept_change)
    except WorkbenchError as exc:
        return str(exc)
    except (OSError, ValueError):
        return None
    return None
