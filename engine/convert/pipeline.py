"""Detect a source's layout, plan its conversion (the dry run: mapping table + resulting config), refuse what does
not map, write the draft atomically, then prove it: validate, load into our model, draft a few tokens."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engine.algos  # noqa: F401  (registers the speculators types vLLM serves)
from engine.algos.loading import load_draft, proposer_for
from engine.convert.base import (
    CONVERTERS,
    NOT_CONVERTIBLE,
    UNMAPPED,
    Converter,
    ConvertJob,
    ConvertOptions,
    MappingRow,
    converters_by_precedence,
)
from engine.convert.inputs import Source, open_source
from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import TensorInfo, save_checkpoint
from engine.format.config import parse_draft_config, refuse_bad_numbers
from engine.format.validate import find_verifier_config, validate_draft
from engine.fsutil import check_replaceable
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate_all
from engine.targets.loading import load_target

log = logging.getLogger(__name__)

SPECULATORS, UNKNOWN = "speculators", "unknown"


@dataclass
class Detection:
    """What a source is: a converter's name, `speculators` (already loadable), a non-convertible layout, or
    `unknown`; for the last two `why` and `instead` say why and what the user can do."""

    format: str
    title: str
    kind: str  # "convertible" | "speculators" | "not-convertible" | "unknown"
    algorithm: str | None = None
    why: str = ""
    instead: str = ""
    index: dict[str, TensorInfo] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "title": self.title, "kind": self.kind, "algorithm": self.algorithm,
                "why": self.why, "instead": self.instead, "tensors": len(self.index)}


def detect_source(source: Source) -> Detection:
    config, index = source.config, source.index()
    kind = config.get("speculators_model_type")
    if isinstance(kind, str) and kind in vr.served_types():
        return Detection(SPECULATORS, f"speculators format ({kind}): vLLM serves it as it is", "speculators",
                         algorithm=kind, index=index)
    for name in NOT_CONVERTIBLE.names():
        layout = NOT_CONVERTIBLE.get(name)
        if layout.matches(config, index):
            title, why, instead = layout.described(config)
            return Detection(name, title, "not-convertible", why=why, instead=instead, index=index)
    for cls in converters_by_precedence():
        conv = cls()
        if conv.matches(config, index):
            return Detection(conv.name, conv.title, "convertible", algorithm=conv.algorithm, index=index)
    known = "; ".join(CONVERTERS.get(n).title for n in CONVERTERS.names())
    return Detection(UNKNOWN, "unknown layout", "unknown",
                     why="neither a speculators config (speculators_model_type) nor a layout the converters know",
                     instead=f"the converters read: {known}; give --format NAME if you know the layout", index=index)


def detect(path: str | os.PathLike) -> Detection:
    return detect_source(open_source(path))


def mapping_rows(conv: Converter, index: dict[str, TensorInfo]) -> list[MappingRow]:
    rows = []
    for name in sorted(index):
        target, note = conv.rename(name)
        rows.append(MappingRow(name, target, index[name].shape, index[name].dtype, note))
    return rows


def mapping_table(path: str | os.PathLike, fmt: str | None = None) -> list[tuple[str, str | None]]:
    """(source name, target name or None) for every tensor (identity for speculators and unknown sources)."""
    source = open_source(path)
    det = detect_source(source)
    fmt = fmt or det.format
    if fmt not in CONVERTERS:
        return [(n, n) for n in sorted(det.index)]
    return [(r.source, r.target) for r in mapping_rows(CONVERTERS.get(fmt)(), det.index)]


@dataclass
class Plan:
    """A conversion worked out in memory: nothing is written (the dry run shows it)."""

    source: Source
    detection: Detection
    converter: Converter
    rows: list[MappingRow]
    config: dict[str, Any]
    state: dict[str, Any]
    problems: list[str]
    defaulted: dict[str, str] = field(default_factory=dict)  # option -> what was chosen for it and why

    def to_json(self) -> dict[str, Any]:
        return {"detection": self.detection.to_json(), "format": self.converter.name,
                "mapping": [r.to_json() for r in self.rows], "config": self.config, "problems": self.problems,
                "defaulted": self.defaulted}


def _converter_for(det: Detection, fmt: str | None, where: str) -> Converter:
    if fmt is None and det.kind != "convertible":
        if det.kind == SPECULATORS:
            raise WorkbenchError("the checkpoint is already in the speculators format", where=where,
                                 hint=f"validate it instead: python -m engine validate {where}")
        raise WorkbenchError(f"{det.title}: {det.why}", where=where, hint=det.instead)
    return CONVERTERS.get(fmt or det.format)()


def plan(path: str | os.PathLike, *, fmt: str | None = None, verifier: str | None = None,
         options: ConvertOptions | None = None, allow_pickle: bool = False) -> Plan:
    """Detect, map every tensor, build the config and check the result against it (loads the weights)."""
    options = options or ConvertOptions()
    source = open_source(path)
    det = detect_source(source)
    conv = _converter_for(det, fmt, str(source.folder))
    refuse_bad_numbers(source.config, str(source.folder / "config.json"))  # before reading any weight
    config = conv.source_config(source.folder, source.config)
    state = source.load(allow_pickle=allow_pickle)
    index = det.index or {k: TensorInfo(k, tuple(v.shape), str(v.dtype), "") for k, v in state.items()}
    rows = mapping_rows(conv, index)
    problems = [f"{r.source} {list(r.shape)}: {UNMAPPED}" for r in rows if r.note == UNMAPPED]
    verifier_config = verifier_config_for(verifier)
    new_state = conv.transform(state, config, options)
    new_config = conv.build_config(config, new_state, verifier=verifier, verifier_config=verifier_config,
                                   options=options)
    problems += tensor_problems(new_config, {k: tuple(v.shape) for k, v in new_state.items()})
    refuse_bad_numbers(new_config, "the converted config (from the source's config and the options)")
    return Plan(source, det, conv, rows, new_config, new_state, problems,
                defaulted_values(conv, config, new_config, options, verifier_config))


def defaulted_values(conv: Converter, config: dict[str, Any], new_config: dict[str, Any], options: ConvertOptions,
                     verifier_config: dict[str, Any] | None) -> dict[str, str]:
    """Values of the converted config that neither the source nor the options gave: a default the user should see
    (and can change with the option named) before anything is written."""
    out: dict[str, str] = {}
    recorded = getattr(conv, "recorded_aux_ids", None)
    if options.aux_layer_ids is None and recorded is not None and recorded(config) is None:
        try:
            ids = parse_draft_config(new_config).aux_layer_ids
        except (KeyError, ValueError):
            ids = None
        if ids:
            depth = (verifier_config or {}).get("num_hidden_layers")
            out["aux_layer_ids"] = (f"{list(ids)}: the source does not record which verifier layers it reads; these "
                                    "are vLLM's default" + (f" for a {depth}-layer verifier" if depth else "")
                                    + ". If the draft was trained on other layers, give them (--aux-layer-ids).")
    return out


def tensor_problems(config: dict[str, Any], shapes: dict[str, tuple]) -> list[str]:
    """Missing, unexpected and wrong-shape tensors of a converted draft, by vLLM's loader for its config."""
    try:
        hf = vr.extract_transformers_pre_trained_config(config)
        expected, optional = vr.expected_parameters(config, hf)
        errors = vr.load_errors(config, hf, shapes)
    except (vr.VllmError, KeyError, TypeError, ValueError) as exc:
        return [f"the converted config is not one vLLM loads: {getattr(exc, 'message', exc)}"]
    problems = [f"{e.field.removeprefix('tensor:')}: {e.message}" for e in errors]
    present = {vr.canonical_name(k) for k in shapes}
    problems += [f"{name} {list(shape)}: missing (the source has no tensor for it)"
                 for name, shape in expected.items() if name not in present and name not in optional]
    vocab, dvocab = int(hf["vocab_size"]), int(hf.get("draft_vocab_size") or hf["vocab_size"])
    if dvocab != vocab and "lm_head.weight" not in present:
        problems.append(f"lm_head.weight: missing (the draft vocabulary is reduced, {dvocab} of {vocab})")
    return problems


def refuse_problems(p: Plan) -> None:
    if p.problems:
        shown = "\n  ".join(p.problems[:20]) + (f"\n  ... and {len(p.problems) - 20} more" if len(p.problems) > 20
                                                 else "")
        raise WorkbenchError(f"the {p.converter.title} tensors do not all map; nothing was written:\n  {shown}",
                             where=str(p.source.folder),
                             hint="check that the source is the layout detected (--format), that its config.json "
                             "matches its weights, and the options (--aux-layer-ids); --dry-run shows the table")


def convert(src: str | os.PathLike, out: str | os.PathLike, options: ConvertJob | None = None, *,
            on_plan: Callable[[Plan], None] | None = None, **fields: Any) -> Path:
    """Convert `src` into a speculators draft at `out` (atomic) and return it; refuses when a tensor does not map.

    `options` (or its `fields`) as `python -m engine convert` takes them. `out` must be new, empty or a draft the
    workbench wrote (`engine.fsutil.is_ours`), unless `options.overwrite`.
    """
    o = options or ConvertJob(**fields)
    check_replaceable(out, overwrite=o.overwrite)  # refuse before reading anything; only the owner marker vouches
    p = plan(src, fmt=o.format, verifier=o.verifier, options=o, allow_pickle=o.allow_pickle)
    if on_plan is not None:  # e.g. the CLI: say which values came from a default
        on_plan(p)
    refuse_problems(p)
    return save_checkpoint(out, p.config, p.state, overwrite=o.overwrite)


def verifier_config_for(verifier: str | None) -> dict[str, Any] | None:
    """The verifier's config.json from local sources only (a folder, the built-in cache, the hub cache)."""
    if not verifier:
        return None

    return find_verifier_config(verifier)


@dataclass
class Verdict:
    """What was proven about a converted draft."""

    valid: bool
    errors: list[str]
    loaded: str = "not tried"  # "ok", "not tried (why)", or the error
    drafted: str = "not tried"
    ok: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def verify(out: str | os.PathLike, verifier: str | None, *, max_new_tokens: int = 8) -> Verdict:
    """`validate`, then (with the verifier at hand) load into our model, a finite forward, a short draft."""
    report = validate_draft(out)
    verdict = Verdict(report.ok, [f"{i.field}: {i.message}" for i in report.errors])
    target = _local_target(verifier)
    if target is None:
        verdict.loaded = verdict.drafted = "not tried (the verifier is not on this machine)"
        verdict.ok = verdict.valid
        return verdict
    try:
        verdict.drafted = _draft_a_few(out, target, max_new_tokens)
        verdict.loaded = "ok"
    except WorkbenchError as exc:
        verdict.loaded = verdict.loaded if verdict.loaded == "ok" else f"failed: {exc.message}"
        verdict.drafted = f"failed: {exc.message}"
    verdict.ok = verdict.valid and verdict.loaded == "ok" and verdict.drafted.startswith("ok")
    return verdict


def _local_target(verifier: str | None):
    if not verifier or verifier_config_for(verifier) is None:
        return None

    try:
        return load_target(verifier, with_tokenizer=True)
    except WorkbenchError as exc:
        log.info("verifier %s not loadable here: %s", verifier, exc.message)
        return None


@contextlib.contextmanager
def _non_finite_outputs(model) -> Iterator[list[str]]:
    """Names of `model`'s weighted modules (linear, embedding, norm) whose output held NaN or inf while the body ran."""
    import torch

    bad: list[str] = []

    def hook(name):
        def check(module, inputs, output):
            outs = output if isinstance(output, (tuple, list)) else (output,)
            if not bad and any(torch.is_tensor(o) and o.is_floating_point() and not bool(torch.isfinite(o).all())
                               for o in outs):
                bad.append(name)
        return check

    handles = [m.register_forward_hook(hook(n or type(m).__name__)) for n, m in model.named_modules()
               if any(True for _ in m.parameters(recurse=False))]
    try:
        yield bad
    finally:
        for h in handles:
            h.remove()


def _draft_a_few(out, target, max_new_tokens: int) -> str:
    """Load the draft through the registry, check that its outputs are finite, and draft through the decode
    engine."""
    import torch


    draft = load_draft(out, target)
    proposer = proposer_for(draft)
    ids = prompt_ids(target.tokenizer, "Write one sentence about the sea.")
    runner = TargetRunner(target, proposer.aux_layer_ids)
    logits, _ = runner.forward(ids, all_logits=False)
    if not bool(torch.isfinite(logits).all()):
        raise WorkbenchError("the target's logits are not finite on the test prompt")
    base, _ = generate_all(TargetRunner(target), ids, SamplingParams(max_new_tokens=max_new_tokens))
    with _non_finite_outputs(draft) as bad:
        spec, events = generate_all(runner, ids, SamplingParams(max_new_tokens=max_new_tokens), proposer, 3)
    if bad:  # the target alone would still be lossless: only the draft's own numbers show it
        raise WorkbenchError(f"the draft's output is not finite on the test prompt (first at {bad[0]})",
                             hint="the converted weights hold NaN or inf (they are copied from the source as "
                             "they are): check the source checkpoint")
    drafted = sum(e.drafted for e in events)
    accepted = sum(e.accepted for e in events)
    if spec != base:
        raise WorkbenchError("speculative output differs from the target alone (the draft broke losslessness)")
    if drafted == 0:
        raise WorkbenchError("the draft proposed no token")
    return f"ok: {len(spec)} tokens, {drafted} drafted, {accepted} accepted, output identical to the target alone"
