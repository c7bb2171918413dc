"""Training–serving parity: what a draft was trained on against how vLLM will run it, each difference named."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError
from engine.format.config import parse_draft_config
from engine.fsutil import read_json
from engine.train.config import TrainConfig
from engine.weightfiles import weight_files

SAME, DIFFERS, UNKNOWN = "same", "differs", "not recorded"
KEPT_RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"  # where recipes keep their records
RUN_CONFIG, KEPT_CONFIG, KEPT_MANIFEST = "config.yaml", "train-config.yaml", "hidden-manifest.json"


@dataclass
class Finding:
    """One factor: what training saw, what serving will do, the verdict, and what a difference does to acceptance."""

    factor: str
    trained: str
    served: str
    verdict: str   # SAME, DIFFERS or UNKNOWN
    effect: str    # the measured or expected effect of a difference, and the fix ("" when the same)


@dataclass
class TrainingRecord:
    """The run that made a draft: its config.yaml (TrainConfig) and, for offline data, the data's manifest."""

    run: Path | None
    config: dict[str, Any]
    manifest: dict[str, Any] | None
    kept: bool = False  # a recipe's records kept in the repository (train-config.yaml, hidden-manifest.json, steps/)


def training_record(draft: str | Path, run: str | Path | None = None) -> TrainingRecord | None:
    """The training run of `draft` (`run`, else the folder the trainer wrote it into: RUN/draft beside
    RUN/config.yaml, else the records its recipe kept for these weights), with its data's manifest when the data or
    its kept copy is there; None when there is no record."""
    from pydantic import ValidationError


    folder = Path(run) if run else Path(draft).resolve().parent
    path = next((folder / n for n in (RUN_CONFIG, KEPT_CONFIG) if (folder / n).is_file()), None)
    if path is None:
        if run:
            raise WorkbenchError(f"{folder} holds no config.yaml: not a training run's folder",
                                 hint="give the --out folder of `train` (it holds config.yaml and draft/)")
        kept = kept_records(draft)
        return training_record(draft, kept) if kept else None
    try:
        config = TrainConfig.from_yaml(path).model_dump()
    except ValidationError as exc:
        raise WorkbenchError(f"{path.name} is not a training run's settings ({exc.error_count()} problem(s))",
                             where=str(path), hint="give the --out folder of `train`") from None
    return TrainingRecord(folder, config, _data_manifest(folder, config), kept=path.name == KEPT_CONFIG)


def _data_manifest(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of the data a run trained on: the copy its recipe kept beside it, else the data's own."""
    for path in (folder / KEPT_MANIFEST, Path(config.get("data") or folder / "-") / "manifest.json"):
        try:
            return read_json(path)
        except (OSError, ValueError):
            continue
    return None


def kept_records(draft: str | Path, root: Path = KEPT_RECORDS) -> Path | None:
    """The training records a recipe kept for these very weights: a `recipe/` folder under `root` whose recipe's
    bench record beside it (`../bench.json`) measured the draft's weight files (`draft_sha256`)."""
    folders = sorted(p.parent for p in root.rglob(f"recipe/{KEPT_CONFIG}")) if root.is_dir() else []
    digest = _weights_digest(Path(draft)) if folders else None
    for folder in folders if digest else []:
        try:
            if read_json(folder.parent / "bench.json").get("draft_sha256") == digest:
                return folder
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _weights_digest(draft: Path) -> str | None:
    """sha256 of a draft's weight files (engine.format.checkpoint.weights_sha256), read again only when they change."""
    try:
        stamps = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in weight_files(draft))
    except (WorkbenchError, OSError):
        return None
    return _digest(str(draft.resolve()), stamps) if stamps else None


@functools.lru_cache(maxsize=16)
def _digest(folder: str, stamps: tuple) -> str:  # `stamps` only keys the cache: changed files, a new digest
    from engine.format.checkpoint import weights_sha256

    return weights_sha256(folder)


def _dataset_answers(dataset: str | None) -> tuple[str, dict[str, Any] | None]:
    """Who wrote the training answers: the first row's `regenerated` record of a JSONL `regenerate` wrote."""
    from engine.data.answers.regenerate import is_own_row

    if not dataset:
        return "not recorded", None
    path = Path(dataset)
    if not path.is_file() or path.suffix != ".jsonl":
        return f"the dataset's own answers ({dataset})", None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    break
                if is_own_row(row):
                    meta = row["regenerated"]
                    how = "greedy" if not meta.get("temperature") else f"sampled at temperature {meta['temperature']}"
                    return f"regenerated by {meta['target']} ({meta.get('backend', '?')}, {how})", meta
                break
    return f"the dataset's own answers ({path.name})", None


def _short(digest: str | None) -> str | None:
    return digest[:23] if digest else digest  # "sha256:" and 16 hex digits


def _finding(factor: str, trained: Any, served: Any, effect: str) -> Finding:
    if trained is None:
        return Finding(factor, "not recorded", str(served), UNKNOWN, effect)
    same = trained == served
    return Finding(factor, str(trained), str(served), SAME if same else DIFFERS, "" if same else effect)


def parity(draft: str | Path, *, run: str | Path | None = None, target: str | None = None,
           dtype: str = "bfloat16", max_model_len: int | None = None, errors: list | None = None) -> dict[str, Any]:
    """Compare the training record of `draft` with serving it by vLLM beside `target` (default: its verifier) at
    `dtype` and `max_model_len`: target weights, layer ids, hidden-state dtype, extraction backend, chat template,
    who wrote the answers, context length, and how vLLM parses the config (`errors`: a `validate` the caller already
    ran, else one here)."""
    from engine.algos.loading import draft_algorithm
    from engine.format.checkpoint import read_config_dict
    from engine.format.validate import validate_draft
    from engine.serve.options import DEFAULT_MAX_MODEL_LEN
    from engine.targets.dtypes import dtype_name, parse_dtype
    from engine.targets.identity import chat_template_digest, draft_verifier
    from engine.targets.resolve import resolve_target

    draft = Path(draft)
    draft_algorithm(draft)  # a registered type (refused clearly otherwise), so that its config parses
    raw = read_config_dict(draft)
    config = parse_draft_config(raw)
    record = training_record(draft, run)
    served_target = target or draft_verifier(draft)
    ref = resolve_target(served_target)
    manifest = (record.manifest if record else None) or {}
    cfg = record.config if record else {}
    online = record is not None and not cfg.get("data")  # states computed in the trainer's process
    findings: list[Finding] = []

    findings.append(_weights_finding(manifest, cfg, raw, ref))

    trained_ids = manifest.get("aux_layer_ids") or cfg.get("aux_layer_ids")
    findings.append(_finding(
        "aux layer ids (vLLM numbering)", sorted(trained_ids) if trained_ids else None,
        sorted(config.aux_layer_ids or []),
        "vLLM feeds the draft other layers than it was trained on: acceptance falls toward none; restore the "
        "config's layer ids, or retrain"))

    served_dtype = dtype_name(parse_dtype(dtype))
    findings.append(_finding(
        "hidden-state dtype", manifest.get("dtype"), served_dtype,
        "the draft reads states rounded otherwise than in training: a small shift of acceptance (measure both "
        "with `evaluate --dtype`)"))

    findings.append(_finding(
        "hidden states computed by", "transformers (online)" if online else manifest.get("backend"), "vllm",
        "the same layer numbering (tests/engine/test_data_vllm.py), values differ by kernel rounding only: expect "
        "little; extract with `--backend vllm` to train on exactly what serving computes"))

    findings.append(_finding(
        "chat template", manifest.get("chat_template_sha256"), chat_template_digest(ref.path),
        "the prompts are rendered otherwise than in training: the draft meets token patterns it never saw; "
        "regenerate and extract with the served tokenizer"))

    findings.append(_answers_finding(manifest.get("dataset") or cfg.get("online_dataset"), ref, record))
    findings.append(_context_finding(cfg.get("max_length"), max_model_len or DEFAULT_MAX_MODEL_LEN))

    if errors is None:
        errors = validate_draft(draft, target=served_target).errors
    findings.append(Finding(
        "config as vLLM parses it", "the config the trainer wrote", f"{len(errors)} error(s) by vLLM's rules",
        SAME if not errors else DIFFERS,
        "" if not errors else "; ".join(f"{i.field}: {i.message}" for i in errors[:3]) + " (`validate` says all)"))
    return {"draft": str(draft), "run": str(record.run) if record else None, "kept": bool(record and record.kept),
            "target": ref.hub_id or ref.name,
            "dtype": served_dtype, "max_model_len": max_model_len or DEFAULT_MAX_MODEL_LEN,
            "findings": [asdict(f) for f in findings],
            "differences": sum(f.verdict == DIFFERS for f in findings),
            "unknown": sum(f.verdict == UNKNOWN for f in findings)}


def _weights_finding(manifest: dict[str, Any], cfg: dict[str, Any], raw: dict[str, Any], ref) -> Finding:
    """The target weights the data was extracted from against the served ones, compared by the kind of digest the
    record holds (the tensors' digest, or the older fingerprint of the weight files)."""
    from engine.targets.identity import VERIFIER_DIGEST, target_digest, target_weight_files, weights_fingerprint

    digest = manifest.get("target_digest") or ((raw.get("speculators_config") or {}).get("verifier") or {}).get(
        VERIFIER_DIGEST)
    if not digest and manifest.get("target_weights"):  # older records: the fingerprint of the weight files
        digest, files = manifest["target_weights"], target_weight_files(ref.path)
        served = weights_fingerprint(files[0].parent) if files else None
    else:
        served = target_digest(ref.path)
    same = digest is not None and digest == served
    return Finding(
        "target weights", _weights_text(cfg.get("target") or manifest.get("target"), digest),
        _weights_text(ref.name, served), UNKNOWN if digest is None or served is None else SAME if same else DIFFERS,
        "" if same else "the draft learned another model's hidden states: its acceptance beside this target is "
        "unknown until measured (`evaluate --target`); retrain on data extracted from this target")


def _weights_text(name: str | None, digest: str | None) -> str:
    """"<the built-in target's description> (sha256:…)": which weights, by name where built in, and their digest."""
    from engine.targets.resolve import BUILTIN_TARGETS

    if digest is None:
        return "not recorded"
    builtin = BUILTIN_TARGETS.get(str(name))
    return f"{builtin.description} ({_short(digest)})" if builtin else _short(digest)


def _step_answers(run: Path, dataset: str | None) -> tuple[str, dict[str, Any]] | None:
    """Who wrote the answers, from the `regenerate` step marker a recipe kept beside its records (`steps/`), when
    that step wrote the data's dataset."""
    try:
        argv = read_json(run / "steps" / "regenerate.json")["argv"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    flags = dict(zip(argv[1::2], argv[2::2], strict=False)) if argv and argv[0] == "regenerate" else {}
    out = flags.get("--out")
    if not out or (dataset and not str(dataset).endswith(out)):
        return None
    meta = {"target": flags.get("--target"), "temperature": float(flags.get("--temperature") or 0),
            "backend": flags.get("--backend", "?")}
    how = "greedy" if not meta["temperature"] else f"sampled at temperature {meta['temperature']}"
    return f"regenerated by {meta['target']} ({meta['backend']}, {how}; the recipe's step record)", meta


def _answers_finding(dataset: str | None, ref, record: TrainingRecord | None) -> Finding:
    """Whether the training answers are this target's own greedy ones (what serving verifies against)."""
    from engine.targets.identity import same_target

    answers, meta = _dataset_answers(dataset)
    if meta is None and record is not None and record.kept:
        answers, meta = _step_answers(record.run, dataset) or (answers, meta)
    own = meta is not None and not meta.get("temperature") and any(
        same_target(str(meta.get("target")), name) for name in (ref.name, ref.hub_id, ref.path) if name)
    return Finding(
        "training answers", answers, f"greedy answers of {ref.hub_id or ref.name}",
        SAME if own else DIFFERS if record is not None else UNKNOWN,
        "" if own else "the draft learned to predict text the target does not write: acceptance at serving is "
        "below what training reported; `regenerate` the data with the target (greedy) and extract again")


def _context_finding(trained: int | None, served: int) -> Finding:
    """Positions serving reaches that training never saw."""
    verdict = UNKNOWN if not trained else SAME if served <= trained else DIFFERS
    return Finding(
        "context length", f"up to {trained} tokens" if trained else "not recorded", f"up to {served} tokens",
        verdict, "" if verdict == SAME else "positions past the trained length were never seen: acceptance there "
        "is not measured (see `evaluate`'s acceptance by answer position), or serve with a smaller --max-model-len")


def parity_table(result: dict[str, Any]) -> str:
    """The findings as a markdown table: factor, training, serving, verdict, effect."""
    lines = ["| factor | training | serving (vLLM) | verdict | what a difference does |", "|---|---|---|---|---|"]
    lines += [f"| {f['factor']} | {f['trained']} | {f['served']} | {f['verdict']} | {f['effect'] or '–'} |"
              for f in result["findings"]]
    return "\n".join(lines)


__all__ = ["DIFFERS", "SAME", "UNKNOWN", "Finding", "TrainingRecord", "kept_records", "parity", "parity_table",
           "training_record"]
