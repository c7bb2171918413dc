"""Every verb's settings come from a typed options model (its flags, their help and defaults), and the app's command
lines parse back into the same options."""

from __future__ import annotations

import argparse
import shlex

from engine.cli import COMMANDS, build_parser
from engine.commands.flags import options_from_args
from engine.generate.options import GenerateOptions

OUTPUT_FLAGS = {"help", "debug", "accept_target_change", "json", "json_out", "write_card", "write_k"}  # not settings
# flags a verb still writes by hand, each a mode or an output rather than a setting of the work
HANDWRITTEN = {"convert": {"out", "dry_run"}, "extract": {"verify"},
               "train": {"config", "algo"}}  # a YAML file under the flags; TrainConfig.algo with the registry's names


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _handwritten(parser: argparse.ArgumentParser) -> set[str]:
    """The optional flags of a verb that no options model generated."""
    return {a.dest for a in parser._actions
            if a.option_strings and not hasattr(a, "options_model") and a.dest not in OUTPUT_FLAGS}


def test_every_verb_takes_its_settings_from_an_options_model():
    parsers = _subparsers()
    assert set(parsers) == set(COMMANDS)
    found = {verb: _handwritten(p) for verb, p in parsers.items() if _handwritten(p)}
    assert found == HANDWRITTEN, "flags written by hand instead of generated from the verb's options model"
    assert {a.options_model for a in parsers["generate"]._actions if hasattr(a, "options_model")} == {GenerateOptions}


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
