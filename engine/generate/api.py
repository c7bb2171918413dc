"""Convenience entry points: build proposers by name, tokenize prompts, find the shipped default draft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import WorkbenchError
from engine.format.checkpoint import read_config_dict
from engine.generate.proposers import Proposer

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "drafts"
DEFAULT_DRAFTS = {"smollm2-135m-instruct": ASSETS / "smollm2-135m-instruct-eagle3"}
METHODS = ("baseline", "draft", "ngram")


def default_draft(target_name: str | None) -> Path | None:
    """The shipped draft for a built-in target, if it exists."""
    from engine.targets import DEFAULT_TARGET, _BUILTIN_BY_HUB_ID

    name = target_name or DEFAULT_TARGET
    builtin = _BUILTIN_BY_HUB_ID.get(str(name).lower())
    path = DEFAULT_DRAFTS.get(builtin.name if builtin else name)
    return path if path is not None and (path / "config.json").is_file() else None


def load_draft_proposer(draft_path: str | Path, target, **options: Any) -> Proposer:
    """A proposer for any supported draft folder, chosen by its `speculators_model_type`."""
    kind = read_config_dict(draft_path).get("speculators_model_type")
    if kind == "eagle3":
        from engine.algos.eagle3 import load_eagle3
        from engine.algos.eagle3.proposer import Eagle3Proposer

        return Eagle3Proposer(load_eagle3(draft_path, target), **options)
    raise WorkbenchError(f"in-process generation does not support '{kind}' drafts yet",
                         hint="use an eagle3 draft, or serve this draft with vLLM (`python -m engine serve`)")


def make_proposer(method: str, target, *, draft: str | Path | None = None, prompt_lookup_min: int = 2,
                  prompt_lookup_max: int = 5, **options: Any) -> Proposer | None:
    """`baseline` -> None, `ngram` -> n-gram lookup, `draft` -> the draft at `draft` (or the shipped default)."""
    if method == "baseline":
        return None
    if method == "ngram":
        from engine.generate.ngram import NgramProposer

        return NgramProposer(prompt_lookup_min, prompt_lookup_max)
    if method in ("draft", "eagle3"):
        path = draft or default_draft(target.ref.name)
        if path is None:
            raise WorkbenchError("no draft given and no shipped draft for this target",
                                 hint="pass --draft DIR (a speculators-format draft folder)")
        return load_draft_proposer(path, target, **options)
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
