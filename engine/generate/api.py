"""Convenience entry points: build proposers by name, tokenize prompts, find the shipped default draft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.algos.loading import is_algorithm, load_draft, proposer_for
from engine.errors import WorkbenchError
from engine.fsutil import read_json
from engine.generate.cpu_kernels import pack_draft_linears
from engine.generate.proposers import Proposer

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafts"
DEFAULTS_FILE = ASSETS / "defaults.json"  # {built-in target name: shipped draft folder} when several ship
METHODS = ("baseline", "draft", "ngram")


def shipped_drafts(target_name: str | None) -> list[Path]:
    """Draft folders under assets/drafts/ whose verifier is this built-in target, the default first."""
    from engine.targets import DEFAULT_TARGET, builtin_for

    builtin = builtin_for(target_name or DEFAULT_TARGET)
    if builtin is None or not ASSETS.is_dir():
        return []
    found = []
    for folder in sorted(p for p in ASSETS.iterdir() if (p / "config.json").is_file()):
        try:
            verifier = (read_json(folder / "config.json").get("speculators_config") or {}).get("verifier") or {}
        except (OSError, ValueError):
            continue
        if builtin_for(verifier.get("name_or_path")) == builtin:
            found.append(folder)
    try:
        preferred = read_json(DEFAULTS_FILE).get(builtin.name) if DEFAULTS_FILE.is_file() else None
    except (OSError, ValueError):
        preferred = None
    return sorted(found, key=lambda p: p.name != preferred)


def default_draft(target_name: str | None) -> Path | None:
    """The shipped draft for a built-in target, if one exists."""
    drafts = shipped_drafts(target_name)
    return drafts[0] if drafts else None


def make_proposer(method: str, target, *, draft: str | Path | None = None, prompt_lookup_min: int = 2,
                  prompt_lookup_max: int = 5, **options: Any) -> Proposer | None:
    """`baseline` -> None, `ngram` -> n-gram lookup, `draft` -> the draft at `draft` (or the shipped default)."""
    if method == "baseline":
        return None
    if method == "ngram":
        from engine.generate.ngram import NgramProposer

        return NgramProposer(prompt_lookup_min, prompt_lookup_max)
    if method == "draft" or is_algorithm(method):
        path = draft or default_draft(target.ref.name)
        if path is None:
            raise WorkbenchError("no draft given and no shipped draft for this target",
                                 hint="pass --draft DIR (a speculators-format draft folder)")
        draft_model = load_draft(path, target)
        pack_draft_linears(draft_model)
        return proposer_for(draft_model, **options)
    raise WorkbenchError(f"unknown method '{method}'", hint=f"choose one of {list(METHODS)}")


def prompt_ids(tokenizer, prompt: str | list[dict] | dict, *, chat: bool = True) -> list[int]:
    """Token ids of a prompt: a string (chat-templated as one user turn when `chat`), a messages list,
    or a {"prompt": ...} / {"messages": [...]} row."""
    if isinstance(prompt, dict):
        prompt = prompt.get("messages") or prompt.get("prompt") or ""
    if isinstance(prompt, list):
        if not prompt:
            raise WorkbenchError("the prompt has no messages")
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    if not str(prompt).strip():
        raise WorkbenchError("the prompt is empty", hint="type a question or instruction")
    if chat and getattr(tokenizer, "chat_template", None):
        return prompt_ids(tokenizer, [{"role": "user", "content": prompt}])
    return list(tokenizer(prompt).input_ids)
