"""Command-line flags generated from a typed options model: one flag per field, its description as the help."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(inner type, optional) for `X | None` / Optional[X]."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), True
    return annotation, False


def _comma_list(item: type, as_tuple: bool):
    def parse(text: str):
        values = [item(x) for x in text.split(",") if x.strip()]
        return tuple(values) if as_tuple else values
    return parse


class _TaggingGroup:
    """An argument group whose new actions remember the options model they came from (`action.options_model`)."""

    def __init__(self, group, model_cls: type[BaseModel]):
        self.group, self.model_cls = group, model_cls

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = self.group.add_argument(*args, **kwargs)
        action.options_model = self.model_cls
        return action


def add_model_fields(parser: argparse.ArgumentParser, model_cls: type[BaseModel], *, skip: Sequence[str] = (),
                     title: str | None = None, defaults: dict[str, str] | None = None,
                     keep_defaults: bool = False) -> None:
    """One flag per pydantic field (`--field-name`), help text from the field's description.

    Flags default to None so that a YAML file can fill what the command line does not, or, with `keep_defaults`,
    to the field's default. `defaults` replaces the default shown in a field's help.
    """
    group = _TaggingGroup(parser.add_argument_group(title or model_cls.__name__,
                                                    (model_cls.__doc__ or "").strip() or None), model_cls)
    for name, field in model_cls.model_fields.items():
        if name in skip:
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        flags = tuple(extra.get("flags", ("--" + name.replace("_", "-"),)))  # a field may have other spellings
        kind, _ = _unwrap(field.annotation)
        origin = typing.get_origin(kind)
        shown = "required" if field.is_required() else field.default if field.default is not None else "none"
        shown = (defaults or {}).get(name, extra.get("shown_default", shown))
        more = extra["more_help"]() if callable(extra.get("more_help")) else ""
        help_text = f"{field.description or ''} " + (more or f"(default: {shown})")
        help_text = help_text.replace("%", "%%")  # argparse %-formats help: a literal percent sign
        default = field.default if keep_defaults and not field.is_required() else None
        kw: dict[str, Any] = {"default": default, "help": help_text, "dest": name}
        if field.is_required() and keep_defaults:
            kw["required"] = True
        if "parse" in extra:  # a field with its own spelling on the command line (e.g. k ranges "1-5")
            group.add_argument(*flags, type=extra["parse"], **kw)
        elif callable(extra.get("choices")):  # choices known at run time (e.g. the registered algorithms)
            group.add_argument(*flags, choices=extra["choices"](), **kw)
        elif kind is bool and extra.get("store_true"):  # a switch that is off unless given (--no-draft)
            group.add_argument(*flags, action="store_true", **{**kw, "default": kw["default"] or None})
        elif kind is bool:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif origin in (tuple, list) or kind in (list, tuple):
            item = (typing.get_args(kind) or (str,))[0]
            kw["help"] += " Comma-separated."
            group.add_argument(*flags, type=_comma_list(item, origin is tuple), **kw)
        elif origin is typing.Literal:
            group.add_argument(*flags, choices=list(typing.get_args(kind)), **kw)
        elif kind in (int, float, str):
            group.add_argument(*flags, type=kind, **kw)
        else:
            group.add_argument(*flags, type=str, **kw)


def model_overrides(args: argparse.Namespace, model_cls: type[BaseModel]) -> dict[str, Any]:
    """Fields given on the command line (not None)."""
    return {n: getattr(args, n) for n in model_cls.model_fields if getattr(args, n, None) is not None}


def options_from_args(args: argparse.Namespace, model_cls: type[BaseModel]):
    """The verb's options model from parsed flags (a field the flags leave None takes the model's default)."""
    return model_cls(**model_overrides(args, model_cls))
