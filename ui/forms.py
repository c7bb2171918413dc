"""Forms generated from pydantic models: one widget per field, its help text from the field's description."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import streamlit as st
from pydantic import BaseModel, ValidationError

from ui.jobs import launch


@dataclass(frozen=True)
class FieldKind:
    kind: str  # bool | choice | int | float | str | list | tuple | json
    optional: bool
    choices: tuple = ()
    item: type = str


def field_kind(annotation: Any) -> FieldKind:
    """What widget a field annotation needs (`X | None` is optional: an empty widget means None)."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else str
        origin = typing.get_origin(annotation)
    if annotation is bool:
        return FieldKind("bool", optional)
    if origin is typing.Literal:
        return FieldKind("choice", optional, typing.get_args(annotation))
    if annotation in (int, float, str):
        return FieldKind(annotation.__name__, optional)
    if origin is list or annotation is list:
        return FieldKind("list", optional, item=(typing.get_args(annotation) or (str,))[0])
    if origin is tuple:
        return FieldKind("tuple", optional, item=(typing.get_args(annotation) or (float,))[0])
    return FieldKind("json", optional)


def to_widget(kind: FieldKind, value: Any) -> Any:
    """A field value as the widget holds it."""
    if kind.kind in ("list", "tuple"):
        return "" if value is None else ", ".join(str(v) for v in value)
    if kind.kind == "str":
        return "" if value is None else str(value)
    if kind.kind == "json":
        return "" if value is None else json.dumps(value)
    return value


def from_widget(kind: FieldKind, raw: Any) -> Any:
    """A widget value back as the field value (text is parsed; what cannot be parsed is kept for validation)."""
    if kind.kind in ("list", "tuple"):
        text = str(raw or "").strip().strip("[]()")
        if not text:
            return None if kind.optional else []
        items = [x.strip() for x in text.split(",") if x.strip()]
        try:
            items = [kind.item(x) for x in items]
        except ValueError:
            return raw  # pydantic names the field and the bad value
        return tuple(items) if kind.kind == "tuple" else items
    if kind.kind == "str":
        text = str(raw or "").strip()
        return None if (kind.optional and not text) else text
    if kind.kind == "json":
        text = str(raw or "").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return raw


def key_for(prefix: str, name: str) -> str:
    return f"{prefix}{name}"


def init_values(prefix: str, model_cls: type[BaseModel], values: dict[str, Any], *, force: bool = False) -> None:
    """Put field values into the widgets' session-state keys (only where unset, unless `force`)."""
    for name, info in model_cls.model_fields.items():
        if name not in values:
            continue
        key = key_for(prefix, name)
        if force or key not in st.session_state:
            st.session_state[key] = to_widget(field_kind(info.annotation), values[name])


def current_values(prefix: str, model_cls: type[BaseModel]) -> dict[str, Any]:
    """The form's values parsed back to field values (fields without a widget value are left out)."""
    out = {}
    for name, info in model_cls.model_fields.items():
        key = key_for(prefix, name)
        if key in st.session_state:
            out[name] = from_widget(field_kind(info.annotation), st.session_state[key])
    return out


def validation_errors(model_cls: type[BaseModel],
                      values: dict[str, Any]) -> tuple[BaseModel | None, dict[str, list[str]]]:
    """(the model, or None) and error messages by field name ("" for errors about several fields)."""
    try:
        return model_cls(**values), {}
    except ValidationError as exc:
        errors: dict[str, list[str]] = {}
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            msg = err["msg"].removeprefix("Value error, ")
            errors.setdefault(field, []).append(msg)
        return None, errors


# labels for field names that words alone do not explain; other names are humanised word by word
LABELS = {"lr": "Learning rate", "min_lr_ratio": "Final learning rate (share of peak)", "out": "Output folder",
          "data": "Hidden-states folder (offline)", "online_dataset": "Dataset (online training)",
          "online_max_samples": "Rows to use (online)", "grad_accum": "Gradient accumulation (micro-batches)",
          "clip_grad": "Gradient clipping (max norm)", "val_fraction": "Validation share",
          "val_every": "Validate every (steps)", "val_max_batches": "Validation batches",
          "log_every": "Log every (steps)", "checkpoint_every": "Checkpoint every (steps)",
          "keep_checkpoints": "Checkpoints to keep", "init_from": "Start from a draft (fine-tune)",
          "aux_layer_ids": "Target layers read (aux layer ids)", "betas": "AdamW betas",
          "weight_decay": "Weight decay (AdamW)", "tokens_per_batch": "Tokens per micro-batch",
          "max_length": "Max tokens per sample", "warmup_steps": "Warm-up steps", "max_steps": "Max steps"}
_WORDS = {"ttt": "TTT", "fc": "FC", "kl": "KL", "lr": "learning rate", "ids": "ids", "vocab": "vocabulary",
          "num": "number of", "val": "validation", "hs": "hidden-state", "lm": "LM", "rms": "RMS"}


def human_label(name: str, info: Any = None) -> str:
    """A field's label: its pydantic title, else LABELS, else its name in words ("ttt_steps" -> "TTT steps")."""
    if info is not None and getattr(info, "title", None):
        return info.title
    if name in LABELS:
        return LABELS[name]
    words = [_WORDS.get(w, w) for w in name.split("_")]
    text = " ".join(words)
    return text[:1].upper() + text[1:]


def field_widget(prefix: str, name: str, info: Any, *, errors: Iterable[str] = (), disabled: bool = False,
                 human: bool = False) -> None:
    """One widget for a pydantic field; the value lives in session state under `prefix + name`.

    With `human`, the label is `human_label` and the help ends with the field's name (its CLI flag)."""
    kind = field_kind(info.annotation)
    key = key_for(prefix, name)
    help_text = info.description or None
    label = name
    if human:
        label = human_label(name, info)
        help_text = f"{help_text or ''}\n\nField `{name}` (flag `--{name.replace('_', '-')}`).".strip()
    common = dict(key=key, help=help_text, disabled=disabled, persist_state="session")
    if kind.kind == "bool":
        st.checkbox(label, **common)
    elif kind.kind == "choice":
        options = list(kind.choices) + ([None] if kind.optional else [])
        if st.session_state.get(key) not in options:
            st.session_state[key] = options[0]
        st.selectbox(label, options, format_func=lambda v: "none" if v is None else str(v), **common)
    elif kind.kind in ("int", "float"):
        step = 1 if kind.kind == "int" else None
        value = st.session_state.get(key)
        if value is not None and not isinstance(value, (int, float)):
            st.session_state[key] = None
        st.number_input(label, step=step, format=None if kind.kind == "int" else "%g",
                        placeholder="none (default)" if kind.optional else None, **common)
    else:
        placeholder = {"list": "comma-separated, e.g. 2, 15, 27", "tuple": "comma-separated",
                       "json": "JSON"}.get(kind.kind, "none" if kind.optional else "")
        st.text_input(label, placeholder=placeholder, **common)
    for message in errors:
        st.caption(f":red[{message}]")


def model_form(prefix: str, model_cls: type[BaseModel], groups: dict[str, list[str]], *, columns: int = 3,
               errors: dict[str, list[str]] | None = None, expanded: Iterable[str] = (),
               exclude: Iterable[str] = (), human: bool = False) -> None:
    """Fields in titled groups (expanders); fields not in any group (nor excluded) go to "Other"."""
    errors = errors or {}
    listed = {n for names in groups.values() for n in names} | set(exclude)
    rest = [n for n in model_cls.model_fields if n not in listed]
    all_groups = {**groups, **({"Other": rest} if rest else {})}
    for title, names in all_groups.items():
        names = [n for n in names if n in model_cls.model_fields]
        bad = any(errors.get(n) for n in names)
        with st.expander(title + (" ⚠️" if bad else ""), expanded=title in expanded or bad):
            cols = st.columns(columns)
            for i, name in enumerate(names):
                with cols[i % columns]:
                    field_widget(prefix, name, model_cls.model_fields[name], errors=errors.get(name, ()),
                                 human=human)


def submit_and_launch(label: str, argv: list[str] | None, *, kind: str, job_key: str, name: str | None = None,
                      icon: str = ":material/rocket_launch:", disabled: bool = False) -> None:
    """A form's submit button that launches `argv` as a background job and keeps its id under `job_key`."""
    if st.form_submit_button(label, type="primary", icon=icon, disabled=disabled or argv is None):
        job = launch(argv, kind=kind, name=name)
        if job:
            st.session_state[job_key] = job.id
