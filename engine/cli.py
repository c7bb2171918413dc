"""Command table and argument plumbing for `python -m engine` (one module per command in engine.commands)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence

import engine.algos  # noqa: F401  (fills the algorithm and config-type registries every command reads)
from engine.errors import translate
from engine.jobs import reporter

# name -> (module in engine.commands, one-line help). Modules are imported only when used.
COMMANDS: dict[str, tuple[str, str]] = {
    "targets": ("targets", "list built-in targets and prepare (dequantize and cache) the default"),
    "validate": ("validate", "validate a draft folder or config.json against vLLM's rules (it names the version) "
                             "and ours"),
    "prepare": ("data", "render a dataset with the target's chat template and loss masks; preview rows"),
    "regenerate": ("data", "re-answer each user turn with the target to build on-policy training data"),
    "extract": ("data", "extract target hidden states to vLLM-format safetensors files"),
    "check": ("check", "check extracted hidden-state files: shapes, dtypes, token ids, finite values, digests"),
    "train": ("train", "train a draft (any registered algorithm) from extracted or online data"),
    "generate": ("generate", "generate with the target, with or without speculative decoding"),
    "bench": ("bench", "benchmark speculative methods against the baseline on the same prompts"),
    "evaluate": ("evaluate", "decoding-exact acceptance per k on held-out target outputs, without decoding"),
    "parity": ("parity", "what a draft was trained on against how vLLM will serve it: each difference and its effect"),
    "repair": ("repair", "store the verifier's embedding in a draft that lacks it (speculators 0.9.0 needs it)"),
    "convert": ("convert",
                "convert a research checkpoint (the known layouts: see --detect) into the speculators format"),
    "recipe": ("recipe", "run a whole named recipe (data, extraction, training, evaluation)"),
    "export": ("export", "export a draft (and its target) to GGUF for llama.cpp, by llama.cpp's own converter"),
    "serve": ("serve", "serve a draft with real vLLM (its own virtual environment) or real llama.cpp"),
    "jobs": ("jobs", "list, inspect or stop background jobs under runs/"),
}


# Commands that run a draft beside a target: they take --accept-target-change (train has it in TrainConfig).
ACCEPT_CHANGE_COMMANDS = frozenset({"generate", "bench", "evaluate", "serve"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="on an error, also print the Python traceback (or set WORKBENCH_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, also print the Python traceback")
        if name in ACCEPT_CHANGE_COMMANDS:
            p.add_argument("--accept-target-change", action="store_true",
                           help="run a draft beside a target whose weights are not those it was trained on (the "
                                "digests of their tensors differ); without it that is refused")
        mod = importlib.import_module(f"engine.commands.{module}")
        getattr(mod, f"add_{name}_arguments", getattr(mod, "add_arguments", lambda _p: None))(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.command:
        parser.print_help()
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command in ACCEPT_CHANGE_COMMANDS and args.accept_target_change:
        from engine.targets.identity import ACCEPT_CHANGE_ENV

        os.environ[ACCEPT_CHANGE_ENV] = "1"  # read by engine.targets.identity.target_for_draft, also in child processes
    _quiet_transformers()
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM behaves like Ctrl-C: commands clean up / checkpoint
    mod = importlib.import_module(f"engine.commands.{args._module}")
    handler = getattr(mod, f"run_{args.command}", getattr(mod, "run", None))
    rep = reporter()  # status.json of the job, when running as one (no-op otherwise)
    return _run(handler, args, rep)


def _run(handler, args, rep) -> int:
    """Run a command; every exception ends as "error: what / where / Fix: how" and an exit code, no traceback
    (unless --debug). Errors we cannot name are reported as a likely bug with exit code 1."""
    debug = bool(getattr(args, "debug", False)) or os.environ.get("WORKBENCH_DEBUG", "") not in ("", "0")
    try:
        rc = int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)  # noqa: T201 - the CLI's own output
        rep.finish("stopped", rep.status.message or "stopped")
        return 130
    except Exception as exc:
        err = translate(exc)
        if debug:
            traceback.print_exc()
        if err is None:
            message = f"{type(exc).__name__}: {exc}"
            print(f"error: unexpected {message}\nFix: this looks like a bug in the workbench; "  # noqa: T201
                  "run the command again with --debug for the traceback and report it", file=sys.stderr)
            rep.finish("failed", message)
            return 1
        print(f"error: {err}", file=sys.stderr)  # noqa: T201
        rep.finish("failed", str(err))
        return 2
    if rep.status.state == "running":
        rep.finish("done" if rc == 0 else "failed", "" if rc == 0 else f"exit code {rc}")
    return rc


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _quiet_transformers() -> None:
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001 - logging tweaks are best effort
        pass
