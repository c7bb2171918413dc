"""Token ids of a prompt: a string (chat-templated as one user turn), a messages list, or a dataset row."""

from __future__ import annotations

from engine.errors import WorkbenchError


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
