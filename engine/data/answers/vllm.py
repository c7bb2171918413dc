"""Answer chat histories through a managed vLLM server: continuous batching makes regeneration ~20x faster on CPU."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class VllmAnswerer:
    """Drop-in for `regenerate.generate_answers`: (text, new tokens, ended) per history, from a vLLM server.

    The server runs the target alone (bf16 by default), in its own environment (engine.serve); requests of a
    batch are sent concurrently so vLLM batches them. Use as a context manager: the server stops on exit.
    """

    def __init__(self, target_name: str | None, *, concurrency: int = 32, dtype: str = "bfloat16",
                 start_timeout: float = 600):
        from engine.serve.server import plan_server, start_server
        from engine.targets.resolve import DEFAULT_TARGET

        log.info("starting a vLLM server for %s (regeneration backend)", target_name or DEFAULT_TARGET)
        self.server = start_server(plan_server(None, target=target_name), timeout=start_timeout, dtype=dtype)
        self.client = self.server.client()
        self._widen_connection_pool(max(1, concurrency))
        self.pool = ThreadPoolExecutor(max(1, concurrency))

    def _widen_connection_pool(self, size: int) -> None:
        """requests keeps 10 connections per host by default; one per request in flight avoids reconnects."""
        from requests.adapters import HTTPAdapter

        self.client._session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=size))

    def __call__(self, target, histories: Sequence[list[dict]], *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, width: int | None = None) -> list[tuple[str, int, bool]]:
        # width: the server's concurrency, set when it started, bounds the requests in flight
        extra = {"top_p": top_p} if temperature > 0 else {}

        def ask(history):
            c = self.client.chat(history, max_tokens=max_new_tokens, temperature=temperature,
                                 return_token_ids=False, **extra)
            return c.text.strip(), c.completion_tokens, c.finish_reason == "stop"

        return list(self.pool.map(ask, histories))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.server.stop()

    def __enter__(self) -> VllmAnswerer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
