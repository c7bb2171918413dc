"""A real `llama-server` for a target GGUF, alone or with a draft and/or an n-gram proposer: plan, run, ask, stop.

`LlamaPlan` says what llama-server is told (its plain command line is what `serve` prints), `LlamaServer` runs it in
its own process group with a log, and `LlamaClient` asks its native `/completion` endpoint for token ids with the
timings and draft counters of each request. Speculative counters per request come from `/metrics` deltas.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import engine.algos  # noqa: F401  (registers the draft types, whose llama.cpp types these are)
from engine.errors import WorkbenchError
from engine.format.config import CONFIG_TYPES, config_type
from engine.fsutil import workbench_home
from engine.jobs import JOB_DIR_ENV, tail
from engine.llamacpp.build import LlamaCpp, ensure_llamacpp
from engine.serve.metrics import parse_prometheus
from engine.serve.process import ManagedServer
from engine.serve.server import free_port

log = logging.getLogger(__name__)

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
PLAIN_DRAFT = "draft-simple"  # a small model of the target's family (no hidden states)
DEFAULT_CTX = 4096
LOG_NAME = "llama-server.log"
PID_NAME = "llama-server.pid"
INFO_NAME = "llama-server.json"
_METRIC = "llamacpp:"


@dataclass
class LlamaPlan:
    """What llama-server serves: a target GGUF, and a draft GGUF and/or n-gram proposers with their settings."""

    target_gguf: Path
    draft_gguf: Path | None = None
    spec_types: tuple[str, ...] = ()  # a draft type and/or n-gram types, e.g. ("ngram-simple",)
    k: int | None = None  # --spec-draft-n-max
    p_min: float | None = None  # --spec-draft-p-min: stop a chain below this draft probability
    extra_args: tuple[str, ...] = ()  # more llama-server speculative flags, e.g. ("--spec-ngram-mod-n-min", "4")
    draft: str | None = None  # the speculators folder the draft GGUF was exported from

    def __post_init__(self) -> None:
        check_spec_types(self.spec_types, has_draft=self.draft_gguf is not None)
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise WorkbenchError(f"--spec-draft-p-min {self.p_min} is not a probability", hint="give 0 to 1")
        if self.k is not None and self.k < 1:
            raise WorkbenchError(f"k = {self.k}: llama.cpp drafts at least one token", hint="give --k 1 or more")

    def args(self) -> list[str]:
        """llama-server's arguments for this plan (without the address, threads and log)."""
        args = ["-m", str(self.target_gguf)]
        if self.draft_gguf is not None:
            args += ["-md", str(self.draft_gguf)]
        if self.spec_types:
            args += ["--spec-type", ",".join(self.spec_types)]
        if self.k is not None and self.spec_types:
            args += ["--spec-draft-n-max", str(self.k)]
        if self.p_min is not None and self.draft_gguf is not None:
            args += ["--spec-draft-p-min", f"{self.p_min:g}"]
        return args + list(self.extra_args)


def draft_types() -> tuple[str, ...]:
    """llama-server's draft types: the plain draft model's and those the registered draft types name."""
    return (PLAIN_DRAFT, *sorted({t for t in (config_type(n).llamacpp_spec_type for n in CONFIG_TYPES.names()) if t}))


def check_spec_types(types: tuple[str, ...], *, has_draft: bool) -> None:
    """Refuse, before anything starts, what llama-server would refuse or ignore: unknown types, a draft type
    without a draft, more than one draft type, a draft without a draft type."""
    known = (*draft_types(), *NGRAM_TYPES)
    if unknown := [t for t in types if t not in known]:
        raise WorkbenchError(f"unknown llama.cpp speculative type {', '.join(unknown)}",
                             hint=f"choose from {', '.join(known)}")
    drafts = [t for t in types if t in draft_types()]
    if len(drafts) > 1:
        raise WorkbenchError(f"llama.cpp mixes one draft type with n-gram proposers, not {' and '.join(drafts)}",
                             hint="keep one draft type")
    if drafts and not has_draft:
        raise WorkbenchError(f"{drafts[0]} needs a draft model", hint="give a draft, or use an n-gram type only")
    if has_draft and not drafts:
        raise WorkbenchError("a draft model is given but no draft type", hint=f"add one of {', '.join(draft_types())}")


def default_threads() -> int:
    """The threads llama.cpp computes with: $OMP_NUM_THREADS where a test or job set a share, else every core."""
    with contextlib.suppress(ValueError):
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    return max(1, os.cpu_count() or 1)


class LlamaServer(ManagedServer):
    """One llama-server in its own process group, logging to `<workdir>/llama-server.log`."""

    FILES = (LOG_NAME, PID_NAME, INFO_NAME)

    def __init__(self, plan: LlamaPlan, *, host: str = "127.0.0.1", port: int | None = None,
                 threads: int | None = None, ctx: int = DEFAULT_CTX, workdir: Path | None = None,
                 build: LlamaCpp | None = None):
        self.plan = plan
        self.host = host
        self.port = port  # None: the first free one from 8080 on, taken when the server starts
        self.threads = threads or default_threads()
        self.ctx = ctx
        self.workdir = Path(workdir) if workdir else None
        self.build = build

    def argv(self, binary: str | Path = "llama-server") -> list[str]:
        """The whole command: the plan, one slot, this address, threads and context, /metrics on."""
        return [str(binary), *self.plan.args(), "--host", self.host, "--port", str(self.port or 8080),
                "-t", str(self.threads),
                "-tb", str(self.threads), "-c", str(self.ctx), "-np", "1", "--metrics", "--no-webui"]

    def command_line(self) -> str:
        """The equivalent plain `llama-server` command (what a user runs without the workbench)."""
        return shlex.join(self.argv())

    def start(self) -> LlamaServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.build = self.build or ensure_llamacpp()
        self.port = self.port or free_port(8080, self.host)  # now, so servers started one after another differ
        self.workdir = self.workdir or _default_workdir(self.port)
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = self.argv(self.build.server)
        log.info("starting llama-server on %s: %s", self.url, shlex.join(argv))
        return self._spawn(argv, _server_env())

    def describe(self) -> dict[str, Any]:
        return {"engine": "llama.cpp", "url": self.url, "port": self.port, "pid": self.proc.pid if self.proc else None,
                "log": str(self.log_path), "target": str(self.plan.target_gguf),
                "draft": self.plan.draft, "draft_gguf": str(self.plan.draft_gguf) if self.plan.draft_gguf else None,
                "spec_types": list(self.plan.spec_types), "k": self.plan.k, "p_min": self.plan.p_min,
                "threads": self.threads, "llama_server": self.command_line(), "started": self.started_at}

    def healthy(self, timeout: float = 5.0) -> bool:
        import requests

        try:
            return requests.get(f"{self.url}/health", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, timeout: float = 300.0, progress: Callable[[str], None] | None = None) -> LlamaServer:
        """Poll /health until the models are loaded; a server that exits or hangs raises with its own words."""
        if self.proc is None:
            self.start()
        deadline, last_note = time.time() + timeout, 0.0
        while True:
            if not self.running():
                raise self.failure(f"llama-server exited with code {self.proc.returncode} before it was ready")
            if self.healthy():
                self.ready_after_s = time.time() - (self.started_at or time.time())
                return self
            if time.time() > deadline:
                self.stop()
                raise self.failure(f"llama-server was not ready after {timeout:.0f} s")
            if progress and time.time() - last_note > 5:
                last_note = time.time()
                progress(f"waiting for llama-server ({time.time() - (self.started_at or 0):.0f} s)")
            time.sleep(0.3)

    def failure(self, message: str) -> WorkbenchError:
        said = llama_error_lines(tail(self.log_path, 200))
        return WorkbenchError(f"{message}.\nllama.cpp says:\n" + ("\n".join(f"  {s}" for s in said[-3:]) or
                              "  (no error line found)") + f"\nLast lines of {self.log_path}:\n"
                              f"{tail(self.log_path, 15)}",
                              hint="fix what llama.cpp reports above (a draft exported for another target, or a "
                                   "setting it refuses), then start the server again")

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None:
            return
        self._stop_group(grace)

    def client(self) -> LlamaClient:
        return LlamaClient(self.url)

    def __enter__(self) -> LlamaServer:
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise


def llama_error_lines(text: str) -> list[str]:
    """llama.cpp's own error lines in a log (`error:`, `failed to`, exceptions), in order."""
    marks = ("error", "failed", "exception", "invalid", "unknown", "not supported", "assert")
    return [ln.strip() for ln in text.splitlines() if any(m in ln.lower() for m in marks) and not ln.startswith("$")]


def _default_workdir(port: int) -> Path:
    job_dir = os.environ.get(JOB_DIR_ENV)
    if job_dir:
        return Path(job_dir)
    return workbench_home() / "llama-servers" / f"{time.strftime('%Y%m%d-%H%M%S')}_{port}"


def _server_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "PYTHON"))}


@dataclass
class LlamaAnswer:
    """One answer: its token ids, its time, and llama.cpp's own counters for it."""

    token_ids: list[int]
    text: str
    seconds: float  # wall time of the request
    predicted_ms: float  # llama.cpp's generation time (prompt excluded)
    prompt_ms: float
    draft_n: int = 0  # tokens drafted
    draft_accepted: int = 0  # drafted tokens accepted
    draft_steps: int = 0  # verification steps that checked a draft (/metrics delta)
    stop: str | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


class LlamaClient:
    """Talks to llama-server's native API."""

    def __init__(self, base_url: str, timeout: float = 600.0):
        import requests

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()

    def complete(self, prompt: list[int] | str, *, max_tokens: int, temperature: float = 0.0, seed: int = 0,
                 counters: bool = True) -> LlamaAnswer:
        """POST /completion with token ids (or text); greedy at temperature 0; the prompt is not cached."""
        before = self.metrics() if counters else {}
        body = {"prompt": prompt, "n_predict": int(max_tokens), "temperature": float(temperature), "seed": int(seed),
                "cache_prompt": False, "return_tokens": True, "stream": False}
        if temperature == 0:
            body.update(top_k=1, top_p=1.0, min_p=0.0)
        start = time.perf_counter()
        data = self._request("POST", "/completion", json=body)
        seconds = time.perf_counter() - start
        after = self.metrics() if counters else {}
        timings = data.get("timings") or {}
        steps = after.get("spec_decode_num_drafts_total", 0) - before.get("spec_decode_num_drafts_total", 0)
        return LlamaAnswer(token_ids=[int(t) for t in data.get("tokens") or []], text=data.get("content") or "",
                           seconds=seconds, predicted_ms=float(timings.get("predicted_ms") or 0.0),
                           prompt_ms=float(timings.get("prompt_ms") or 0.0), draft_n=int(timings.get("draft_n") or 0),
                           draft_accepted=int(timings.get("draft_n_accepted") or 0), draft_steps=int(steps),
                           stop=data.get("stop_type"))

    def metrics(self) -> dict[str, float]:
        """llama.cpp's Prometheus counters, without their `llamacpp:` prefix."""
        import requests

        try:
            resp = self._session.get(f"{self.base_url}/metrics", timeout=30)
        except requests.RequestException as exc:
            raise WorkbenchError(f"GET {self.base_url}/metrics failed: {exc}", hint="is llama-server running?") from exc
        return {name.removeprefix(_METRIC): value for name, _labels, value in parse_prometheus(resp.text)}

    def top_logprobs(self, prompt: list[int], n: int = 2) -> dict[int, float]:
        """The target's log-probabilities of its `n` likeliest next tokens after `prompt` (token ids)."""
        body = {"prompt": prompt, "n_predict": 1, "n_probs": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "post_sampling_probs": False}
        data = self._request("POST", "/completion", json=body)
        first = (data.get("completion_probabilities") or [{}])[0]
        return {int(p["id"]): float(p["logprob"]) for p in first.get("top_logprobs") or []}

    def tokenize(self, text: str) -> list[int]:
        return list(self._request("POST", "/tokenize", json={"content": text}).get("tokens") or [])

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        import requests

        url = self.base_url + path
        try:
            resp = self._session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise WorkbenchError(f"{method} {url} failed: {exc}", hint="is llama-server running? start it with "
                                 "`python -m engine serve --engine llama.cpp`") from exc
        if resp.status_code >= 400:
            raise WorkbenchError(f"{method} {url} returned {resp.status_code}: {resp.text[:600]}",
                                 hint="see the llama-server log for its own message")
        return resp.json()
