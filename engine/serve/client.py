"""A tiny OpenAI-compatible client for a vLLM server (completions and chat completions) with timing and token ids."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from engine.errors import WorkbenchError

log = logging.getLogger(__name__)


@dataclass
class Completion:
    """One generated answer, what it cost, and the token ids when the server returns them."""

    text: str
    completion_tokens: int
    prompt_tokens: int
    seconds: float
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


class VllmClient:
    """Talks to `<base_url>/v1/...`; `model` defaults to the first (only) model the server serves."""

    def __init__(self, base_url: str, *, model: str | None = None, timeout: float = 600.0):
        import requests

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._model = model
        self._session = requests.Session()
        self._token_ids_supported = True

    # -- server --------------------------------------------------------------------------------
    def health(self, timeout: float = 5.0) -> bool:
        import requests

        try:
            return self._session.get(f"{self.base_url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def models(self) -> list[str]:
        data = self._request("GET", "/v1/models")
        return [m["id"] for m in data.get("data", [])]

    @property
    def model(self) -> str:
        if self._model is None:
            names = self.models()
            if not names:
                raise WorkbenchError(f"{self.base_url} serves no model", hint="check the server log")
            self._model = names[0]
        return self._model

    # -- generation ----------------------------------------------------------------------------
    def complete(self, prompt: str | list[int], *, max_tokens: int = 64, temperature: float = 0.0,
                 seed: int | None = None, return_token_ids: bool = True, **extra: Any) -> Completion:
        """POST /v1/completions with one prompt (text or token ids); greedy when temperature is 0."""
        body = {"model": self.model, "prompt": prompt, **self._sampling(max_tokens, temperature, seed), **extra}
        return self._generate("/v1/completions", body, return_token_ids, chat=False)

    def chat(self, messages: list[dict[str, Any]], *, max_tokens: int = 64, temperature: float = 0.0,
             seed: int | None = None, return_token_ids: bool = True, **extra: Any) -> Completion:
        """POST /v1/chat/completions with a message list (the server applies the model's chat template)."""
        body = {"model": self.model, "messages": messages, **self._sampling(max_tokens, temperature, seed), **extra}
        return self._generate("/v1/chat/completions", body, return_token_ids, chat=True)

    def generate(self, item: dict[str, Any], **kwargs: Any) -> Completion:
        """`{"prompt": str}` goes to completions, `{"messages": [...]}` to chat completions."""
        if "messages" in item:
            return self.chat(item["messages"], **kwargs)
        if "prompt" in item:
            return self.complete(item["prompt"], **kwargs)
        raise WorkbenchError(f"a prompt item needs 'prompt' or 'messages', got keys {sorted(item)}",
                             hint='give {"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}]}')

    @staticmethod
    def _sampling(max_tokens: int, temperature: float, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": int(max_tokens), "temperature": float(temperature)}
        if seed is not None:
            body["seed"] = int(seed)
        if temperature == 0:
            body["top_p"] = 1.0
        return body

    def _generate(self, path: str, body: dict[str, Any], return_token_ids: bool, *, chat: bool) -> Completion:
        if return_token_ids and self._token_ids_supported:
            body = {**body, "return_token_ids": True}
        start = time.perf_counter()
        try:
            data = self._request("POST", path, json=body)
        except WorkbenchError as exc:
            if "return_token_ids" not in body or "return_token_ids" not in str(exc):
                raise
            log.info("the server does not know return_token_ids; asking without it")
            self._token_ids_supported = False
            body = {k: v for k, v in body.items() if k != "return_token_ids"}
            start = time.perf_counter()
            data = self._request("POST", path, json=body)
        seconds = time.perf_counter() - start
        choice = (data.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or "" if chat else choice.get("text") or ""
        usage = data.get("usage") or {}
        token_ids = choice.get("token_ids")
        return Completion(
            text=text,
            completion_tokens=int(usage.get("completion_tokens") or len(token_ids or [])),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            seconds=seconds,
            finish_reason=choice.get("finish_reason"),
            token_ids=list(token_ids) if token_ids is not None else None,
            prompt_token_ids=data.get("prompt_token_ids") or choice.get("prompt_token_ids"),
            raw=data,
        )

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        import requests

        url = self.base_url + path
        try:
            resp = self._session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise WorkbenchError(f"{method} {url} failed: {exc}", hint="is the vLLM server running? "
                                 "start it with `python -m engine serve`") from exc
        if resp.status_code >= 400:
            raise WorkbenchError(f"{method} {url} returned {resp.status_code}: {resp.text[:800]}",
                                 hint="see the server log for vLLM's own message")
        try:
            return resp.json()
        except ValueError as exc:
            raise WorkbenchError(f"{method} {url} did not return JSON: {resp.text[:200]!r}") from exc
