"""Every verb's flags come from a typed options model (those still without one are named), and the app's command
lines parse back into the same options."""

from __future__ import annotations

import argparse
import shlex

from pydantic import BaseModel

from engine.cli import COMMANDS, build_parser
from engine.commands.flags import options_from_args
from engine.generate.options import GenerateOptions

# verbs whose flags are still written by hand in their command module (issue 64: give each a model)
UNTYPED = {"targets", "validate", "check", "repair", "recipe", "jobs"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _models() -> list[type[BaseModel]]:
    seen, todo = [], [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen and sub.__module__.startswith("engine."):
                seen.append(sub)
            todo.append(sub)
    return seen


def _model_of(parser: argparse.ArgumentParser) -> type[BaseModel] | None:
    """An options model all of whose fields are flags of this parser (dest = field name), the largest such."""
    dests = {a.dest for a in parser._actions}
    fitting = [m for m in _models() if m.model_fields and set(m.model_fields) <= dests and len(m.model_fields) > 2]
    return max(fitting, key=lambda m: len(m.model_fields), default=None)


def test_every_verb_but_the_named_ones_takes_its_flags_from_an_options_model():
    parsers = _subparsers()
    assert set(parsers) == set(COMMANDS)
    typed = {verb for verb, p in parsers.items() if _model_of(p) is not None}
    assert set(COMMANDS) - typed == UNTYPED, "a verb gained or lost its options model: update UNTYPED"
    assert _model_of(parsers["generate"]) is GenerateOptions


def test_a_generate_command_the_app_builds_parses_back_into_its_options():
    from ui.chat import generate_commands

    lines = generate_commands("say 'hi' twice", {"target": "t dir", "k": 5, "max_new_tokens": 7,
                                                   "temperature": 0.5, "seed": 3}, {"d": "/x y/draft", "ngram": None})
    parsed = [options_from_args(build_parser().parse_args(shlex.split(line)[3:]), GenerateOptions)
              for line in lines.splitlines()]
    assert [o.method for o in parsed] == ["baseline", "draft", "ngram"]
    assert parsed[1] == GenerateOptions(target="t dir", method="draft", draft="/x y/draft", k=5, max_new_tokens=7,
                                        temperature=0.5, seed=3)
    assert {o.draft for o in parsed} == {None, "/x y/draft"}
    args = build_parser().parse_args(shlex.split(lines.splitlines()[0])[3:])
    assert args.prompt == "say 'hi' twice"
