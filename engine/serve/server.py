"""Start, health-check and stop a real vLLM OpenAI server for a target, with or without a speculators draft."""

# `plan_server` decides what vLLM is told (the draft folder as the model, or the target plus an explicit
# `--speculative-config`), `VllmServer` runs it in its own process group with a log and a PID file, and
# `ServerPool` keeps at most one server alive and reuses it for equal plans (tests and benchmarks).
#
# Offline auto-detection: `vllm serve <draft>` replaces the model and the tokenizer with the verifier named
# in the draft's config (a hub id). For a built-in target that hub id is not downloadable here, so the
# server gets a private Hugging Face hub cache (HF_HUB_CACHE) in which the hub id's snapshot is a symlink to
# the workbench's local copy of the target, and HF_HUB_OFFLINE=1 makes every lookup resolve from it.

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engine.algos  # noqa: F401  (registers the speculators types a served draft is validated and planned with)
from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import read_config_dict
from engine.format.config import config_type, vllm_own_form
from engine.format.validate import format_report, validate_draft
from engine.fsutil import atomic_write_text, workbench_home
from engine.jobs import JOB_DIR_ENV, runs_dir, tail
from engine.serve.client import VllmClient
from engine.serve.options import ServerSettings
from engine.serve.process import ManagedServer, stop_process_group
from engine.serve.venv import VllmEnv, ensure_vllm_env
from engine.targets.identity import target_for_draft
from engine.targets.resolve import BUILTIN_BY_HUB_ID, in_hf_cache, resolve_target, resolves_locally

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_GIB = 2
DEFAULT_START_TIMEOUT = 600.0
LOG_NAME = "vllm.log"
PID_NAME = "vllm.pid"
INFO_NAME = "vllm.json"
FORMS = ("auto", "explicit")


# -- what to serve -------------------------------------------------------------------------------


@dataclass
class ServePlan:
    """What the vLLM server is asked to serve, and how (`form`: auto | explicit | none)."""

    model: str
    target: str  # local folder (or hub id) of the target that is actually served
    form: str
    draft: str | None = None
    speculative_config: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    served_model_name: str | None = None
    validation: Any = None  # the draft's ValidationReport, when validated
    draft_config: dict[str, Any] | None = field(default=None, repr=False)  # the draft's config.json, as read
    lossy: str | None = None  # why this speculative config's output is not the target's (vllm_rules.lossy_reason)

    def key(self) -> str:
        """Equal keys = the same server (used to reuse a running one)."""
        return json.dumps([self.model, self.target, self.form, self.speculative_config], sort_keys=True)

    def vllm_args(self) -> list[str]:
        """The `vllm serve` arguments that describe this plan (without the deployment flags)."""
        args = [self.model]
        if self.speculative_config:
            args += ["--speculative-config", json.dumps(self.speculative_config, separators=(", ", ": "))]
        return args

    def vllm_serve_line(self) -> str:
        return "vllm serve " + shlex.join(self.vllm_args())


def plan_server(draft: str | os.PathLike | None = None, *, target: str | os.PathLike | None = None,
                k: int | None = None, form: str | None = None, speculative_config: dict[str, Any] | None = None,
                validate: bool = True, hub_cache: Path | None = None) -> ServePlan:
    """The plan of `_plan_server`, its speculative config checked by vLLM's rules and labelled when lossy."""
    plan = _plan_server(draft, target=target, k=k, form=form, speculative_config=speculative_config,
                        validate=validate, hub_cache=hub_cache)
    if speculative_config and plan.speculative_config:  # the user's fields (auto: vLLM merges them with the draft's)
        spec = plan.speculative_config
        if plan.form == "auto":
            spec = {**_derived_speculative_config(plan.draft_config, plan.validation), **spec}
        refused, plan.lossy = vr.speculative_config_verdict(spec)
        if refused:
            raise WorkbenchError(f"vLLM would refuse this speculative config: {refused.vllm_message}",
                                 hint=f"fix '{refused.field}' ({vr.RULES_LABEL} rules)")
    return plan


def _plan_server(draft: str | os.PathLike | None = None, *, target: str | os.PathLike | None = None,
                 k: int | None = None, form: str | None = None, speculative_config: dict[str, Any] | None = None,
                 validate: bool = True, hub_cache: Path | None = None) -> ServePlan:
    """Decide the vLLM arguments for a draft folder (or none) and a target (default: the draft's verifier).

    `form="auto"` serves the draft folder as the model (vLLM reads the verifier from its config);
    `form="explicit"` serves the target with `--speculative-config {method, model, num_speculative_tokens}`.
    Without a form, auto is used when the target is the draft's own verifier. `speculative_config` without
    a draft serves the target with that config (e.g. ngram). `validate` refuses invalid drafts first.
    """
    if form is not None and form not in FORMS:
        raise WorkbenchError(f"unknown form '{form}'", hint=f"use one of {list(FORMS)}")
    if draft is None:
        ref = resolve_target(target)
        spec = dict(speculative_config) if speculative_config else None
        if spec and k is not None:
            spec["num_speculative_tokens"] = int(k)
        return ServePlan(model=ref.path, target=ref.path, form="explicit" if spec else "none",
                         speculative_config=spec, env=_hf_env(None), served_model_name=ref.hub_id or ref.name)
    draft_dir = Path(draft).expanduser().resolve()
    cfg, report = _checked_draft(draft_dir, validate)
    verifier = cfg["speculators_config"]["verifier"]["name_or_path"]
    derived = _derived_speculative_config(cfg, report)
    same_target = target is None or _same_target(target, verifier)
    own_form = vllm_own_form(cfg)
    if own_form and form == "auto":
        raise WorkbenchError(f"{own_form}; the auto form cannot serve it", hint="drop --form auto")
    if form is None:
        form = "explicit" if own_form or not same_target else "auto"
    if form == "auto" and not same_target:
        raise WorkbenchError(f"the auto-detection form serves the draft's verifier '{verifier}', not '{target}'",
                             hint="use --form explicit to pair the draft with another target, or drop --target")
    if target is not None or resolves_locally(verifier):
        # refuses a target of another shape than the draft's verifier, or other weights than those it was trained on
        target_for_draft(draft_dir, str(target) if target is not None else None)
    if form == "auto":
        overrides = dict(speculative_config or {})
        if k is not None:
            overrides["num_speculative_tokens"] = int(k)
        target_path, env = _auto_target(verifier, hub_cache)
        return ServePlan(model=str(draft_dir), target=target_path, form="auto", draft=str(draft_dir),
                         speculative_config=overrides or None, env=env, served_model_name=None, validation=report,
                         draft_config=cfg)
    ref = resolve_target(target if target is not None else verifier)
    model = _write_own_form(cfg, draft_dir) if own_form else draft_dir
    spec = {"method": derived["method"], "model": str(model),
            "num_speculative_tokens": int(k if k is not None else derived["num_speculative_tokens"])}
    if derived.get("parallel_drafting"):
        spec["parallel_drafting"] = True
    spec.update(speculative_config or {})
    return ServePlan(model=ref.path, target=ref.path, form="explicit", draft=str(draft_dir), speculative_config=spec,
                     env=_hf_env(None), served_model_name=ref.hub_id or ref.name, validation=report,
                     draft_config=cfg)


def _write_own_form(cfg: dict[str, Any], draft_dir: Path) -> Path:
    """vLLM's own form of the draft, written afresh under runs/vllm-forms/ (a folder per draft path)."""
    key = hashlib.sha256(str(draft_dir).encode()).hexdigest()[:10]
    out = runs_dir() / "vllm-forms" / f"{draft_dir.name}-{key}"
    return config_type(cfg["speculators_model_type"]).write_vllm_own_form(cfg, draft_dir, out)


def _checked_draft(draft_dir: Path, validate: bool):
    if not draft_dir.is_dir():
        raise WorkbenchError(f"{draft_dir} is not a folder", hint="give the draft folder (config.json + weights)")
    cfg = read_config_dict(draft_dir)
    report = validate_draft(draft_dir) if validate else None
    if report is not None and not report.ok:
        raise WorkbenchError(f"the draft is not servable:\n{format_report(report)}",
                             hint="fix the errors above (or pass --no-validate to let vLLM judge it)")
    try:
        cfg["speculators_config"]["verifier"]["name_or_path"]
    except (KeyError, TypeError):
        raise WorkbenchError("config.json has no speculators_config.verifier.name_or_path", where=str(draft_dir),
                             hint="this is not a speculators draft; run `python -m engine validate` on it") from None
    return cfg, report


def _derived_speculative_config(cfg: dict[str, Any], report) -> dict[str, Any]:
    """vLLM's own {method, num_speculative_tokens[, parallel_drafting]} for this config."""
    if report is not None and report.vllm_speculative_config:
        return dict(report.vllm_speculative_config)
    try:
        return vr.build_vllm_speculative_config(cfg)
    except (vr.VllmError, KeyError, TypeError) as exc:
        raise WorkbenchError(f"cannot derive vLLM's speculative config: {exc}",
                             hint="run `python -m engine validate` on the draft") from exc


def _same_target(target: str | os.PathLike, verifier: str) -> bool:
    if str(target) == verifier:
        return True
    try:
        a, b = resolve_target(target), resolve_target(verifier)
    except WorkbenchError:
        return False
    return Path(a.path).resolve() == Path(b.path).resolve() if Path(a.path).exists() else a.path == b.path


def _auto_target(verifier: str, hub_cache: Path | None) -> tuple[str, dict[str, str]]:
    """Where the verifier's weights come from when the draft folder is the model, and the env that makes it so."""
    builtin = BUILTIN_BY_HUB_ID.get(verifier.lower())
    if builtin is not None:
        folder = Path(resolve_target(builtin.name).path)
        cache = link_into_hub_cache(verifier, folder, hub_cache or default_hub_cache())
        return str(folder), _hf_env(cache)
    if Path(verifier).expanduser().is_dir():
        return str(Path(verifier).expanduser().resolve()), _hf_env(None)

    if not in_hf_cache(verifier) and _offline():
        raise WorkbenchError(f"the draft's verifier '{verifier}' is not in the local Hugging Face cache and this "
                             "server runs offline", hint="download it first, or serve a local copy with "
                             "--target <folder> --form explicit")
    return verifier, _hf_env(None)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "1").lower() not in ("0", "false", "no")


def _hf_env(hub_cache: Path | None) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1" if _offline() else "0", "TRANSFORMERS_OFFLINE": "1" if _offline() else "0"}
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    return env


def default_hub_cache() -> Path:
    return workbench_home() / "vllm-hf-hub"


def link_into_hub_cache(repo_id: str, folder: Path, cache: Path) -> Path:
    """Make `repo_id` resolve offline to `folder` in the Hugging Face hub cache layout under `cache`.

    models--<org>--<name>/refs/main holds a revision; snapshots/<revision> is a symlink to the folder. The
    revision is derived from the folder's path and its files' sizes and times, so a re-prepared target gets a
    new snapshot. Idempotent and safe to run concurrently (atomic renames).
    """
    folder = folder.resolve()
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    fingerprint = [str(folder)] + [f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}"
                                   for p in sorted(folder.iterdir()) if p.is_file()]
    revision = hashlib.sha1("\n".join(fingerprint).encode()).hexdigest()
    snapshot = repo_dir / "snapshots" / revision
    if not (snapshot.is_symlink() and snapshot.resolve() == folder):
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        tmp = snapshot.with_name(f".{revision}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(folder, target_is_directory=True)
        os.replace(tmp, snapshot)
    refs = repo_dir / "refs" / "main"
    if not refs.is_file() or refs.read_text().strip() != revision:
        atomic_write_text(refs, revision)
    return cache


# -- the server process --------------------------------------------------------------------------


def free_port(preferred: int | None = None, host: str = "127.0.0.1") -> int:
    """`preferred` if nothing listens there, else a port the OS picks."""
    if preferred:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, int(preferred)))
                return int(preferred)
            except OSError:
                pass
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def default_workdir(port: int) -> Path:
    """Inside a job: its folder; otherwise <WORKBENCH_HOME>/vllm-servers/<time>_<port>."""
    job_dir = os.environ.get(JOB_DIR_ENV)
    if job_dir:
        return Path(job_dir)
    return workbench_home() / "vllm-servers" / f"{time.strftime('%Y%m%d-%H%M%S')}_{port}"


_ERROR_LINE = re.compile(r"\b([A-Z][A-Za-z]*(?:Error|Exception)|KeyError|AssertionError): (.+)$")
_NOT_ERROR = re.compile(r"\b(?:WARNING|INFO|DEBUG)\s+\d\d-\d\d ")
_GENERIC = ("Engine core initialization failed", "See root cause above", "Failed core proc", "exit code",
            "EngineDeadError", "encountered an issue")


def vllm_error_lines(text: str) -> list[str]:
    """vLLM's own error lines in a log (`SomeError: message`), root causes first, generic wrappers last."""
    seen: list[str] = []
    for line in text.splitlines():
        if _NOT_ERROR.search(line):
            continue  # e.g. a warning that mentions "OSError: [Errno 24]" as an example
        m = _ERROR_LINE.search(line)
        if m:
            msg = f"{m.group(1)}: {m.group(2).strip()}"
            if msg not in seen:
                seen.append(msg)
    return sorted(seen, key=lambda s: any(g in s for g in _GENERIC))


def vllm_failure(message: str, log_path: Path, *, hint: str, last_lines: int = 25) -> WorkbenchError:
    """An error for a vLLM process that stopped: `message`, vLLM's own error lines (root causes first) and the end
    of its log."""
    errors = vllm_error_lines(tail(log_path, 400))
    said = "\n".join(f"  {e}" for e in errors[:3]) or "  (no error line found)"
    return WorkbenchError(f"{message}.\nvLLM says:\n{said}\nLast lines of {log_path}:\n{tail(log_path, last_lines)}",
                          hint=hint)


def vllm_process_env(venv: VllmEnv, *, kv_cache_gib: float | None = None) -> dict[str, str]:
    """The environment of a vLLM process from `venv`: this one's without our own python paths, the flavour's runtime
    (tcmalloc, OpenMP), no usage reports, and on CPU the KV cache's size (VLLM_CPU_KVCACHE_SPACE, GiB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"))}
    env.update(venv.runtime_env())
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    if venv.flavor == "cpu":
        kv = kv_cache_gib if kv_cache_gib is not None else os.environ.get("VLLM_CPU_KVCACHE_SPACE",
                                                                          DEFAULT_KV_CACHE_GIB)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(float(kv)))
    return env


class VllmServer(ManagedServer):
    """One vLLM OpenAI server in its own process group, logging to `<workdir>/vllm.log`."""

    FILES = (LOG_NAME, PID_NAME, INFO_NAME)

    def __init__(self, plan: ServePlan, settings: ServerSettings | None = None, *, port: int | None = None,
                 workdir: Path | None = None, venv: VllmEnv | None = None, extra_args: list[str] | None = None,
                 extra_env: dict[str, str] | None = None, lossless_only: bool = True, **setting_fields: Any):
        """`settings` (or its fields: host, dtype, max_model_len, kv_cache_gib) as `serve` takes them;
        `lossless_only=False` starts what the CPU build is known to decode unlike its baseline (a benchmark of it)."""
        settings = settings or ServerSettings(**setting_fields)
        self.plan = plan
        self.host = settings.host
        self.port = port or free_port(8000, self.host)
        self.workdir = Path(workdir) if workdir else default_workdir(self.port)
        self.venv = venv
        self.max_model_len = settings.max_model_len
        self.dtype = settings.dtype
        self.kv_cache_gib = settings.kv_cache_gib
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(extra_env or {})
        self.lossless_only = lossless_only

    # -- facts ---------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @functools.cached_property
    def _target_config(self) -> dict[str, Any]:
        """The served target's config.json, read once ({} when it is not a readable local folder)."""
        config = Path(str(self.plan.target)) / "config.json"
        try:
            cfg = json.loads(config.read_text()) if config.is_file() else {}
        except (OSError, ValueError):
            cfg = {}
        return cfg if isinstance(cfg, dict) else {}

    def model_len(self) -> int:
        """`max_model_len`, capped at the target's own max_position_embeddings (vLLM refuses a longer one)."""
        cfg = self._target_config
        limit = (cfg.get("text_config") or cfg).get("max_position_embeddings")
        return min(self.max_model_len, int(limit)) if isinstance(limit, int) and limit > 0 else self.max_model_len

    def argv(self) -> list[str]:
        venv = self.venv or ensure_vllm_env()
        args = [*venv.server_argv(), self.plan.model]
        if self.plan.speculative_config:
            args += ["--speculative-config", json.dumps(self.plan.speculative_config)]
        if self.plan.served_model_name:
            args += ["--served-model-name", self.plan.served_model_name]
        args += ["--host", self.host, "--port", str(self.port), "--max-model-len", str(self.model_len()),
                 "--dtype", self.dtype]
        if venv.flavor == "cpu":
            args += ["--enforce-eager", *self._cpu_speculation_args()]
        return args + self.extra_args

    def _cpu_speculation_args(self) -> list[str]:
        """The CPU build beside a draft: refused for targets it does not serve as its baseline (unless
        `lossless_only` is off, to measure that), and prefix caching off beside recurrent layers."""
        if not (self.plan.speculative_config or self.plan.draft):
            return []
        config = self._target_config
        refusal = vr.cpu_build_refusal(config)
        if refusal and self.lossless_only:
            raise WorkbenchError(refusal, hint=vr.CPU_BUILD_HINT)
        # prefix caching puts vLLM's Mamba cache in its 'align' mode, whose copies between speculative steps are
        # Triton kernels the CPU build cannot run (the server dies at its first request)
        return ["--no-enable-prefix-caching"] if vr.has_recurrent_layers(config) else []

    def environment(self) -> dict[str, str]:
        env = vllm_process_env(self.venv or ensure_vllm_env(), kv_cache_gib=self.kv_cache_gib)
        env.update(self.plan.env)
        env.update(self.extra_env)
        return env

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> VllmServer:
        """Launch the server (returns at once; see wait_ready)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.venv = self.venv or ensure_vllm_env()
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv, env = self.argv(), self.environment()
        log.info("starting vLLM on %s: %s", self.url, shlex.join(argv))
        return self._spawn(argv, env)

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "port": self.port, "pid": self.pid, "pgid": self.pid, "log": str(self.log_path),
                "form": self.plan.form, "model": self.plan.model, "target": self.plan.target,
                "draft": self.plan.draft, "speculative_config": self.plan.speculative_config,
                "vllm_serve": self.plan.vllm_serve_line(), "started": self.started_at}

    def healthy(self, timeout: float = 5.0) -> bool:
        import requests

        try:
            if requests.get(f"{self.url}/health", timeout=timeout).status_code != 200:
                return False
            return requests.get(f"{self.url}/v1/models", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, timeout: float = DEFAULT_START_TIMEOUT, poll: float = 1.0,
                   progress: Callable[[str], None] | None = None) -> VllmServer:
        """Poll /health and /v1/models until both answer; a dead or slow server raises with vLLM's own words."""
        if self.proc is None:
            self.start()
        deadline = time.time() + timeout
        last_note = 0.0
        while True:
            if not self.running():
                raise self._failure(f"the vLLM server exited with code {self.proc.returncode} before it was ready")
            if self.healthy():
                self.ready_after_s = time.time() - (self.started_at or time.time())
                log.info("vLLM ready on %s after %.1f s", self.url, self.ready_after_s)
                return self
            if time.time() > deadline:
                self.stop()
                raise self._failure(f"the vLLM server was not ready after {timeout:.0f} s",
                                    hint="raise the start timeout, or look at the log for what it was doing")
            if progress and time.time() - last_note > 10:
                last_note = time.time()
                progress(f"waiting for vLLM ({time.time() - self.started_at:.0f} s): "
                         f"{tail(self.log_path, 1)[:120]}")
            time.sleep(poll)

    def _failure(self, message: str, *, hint: str | None = None) -> WorkbenchError:
        return vllm_failure(message, self.log_path, hint=hint or "fix what vLLM reports above (for a draft: "
                            "`python -m engine validate <draft>` shows the same rules), then start the server again")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            log.info("stopping vLLM on %s", self.url)
        self._stop_group(grace)

    def memory_bytes(self) -> int:
        """Resident memory of the server and all its children (0 when not running)."""
        if not self.running():
            return 0
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def client(self, **kwargs: Any):
        return VllmClient(self.url, **kwargs)

    def __enter__(self) -> VllmServer:
        self.start().wait_ready()
        return self


def stop_server_in(workdir: Path, grace: float = 20.0) -> bool:
    """Stop the server whose PID file is in `workdir` (from another process). False if none was running."""
    try:
        pid = int((Path(workdir) / PID_NAME).read_text().strip())
    except (OSError, ValueError):
        return False
    stopped = stop_process_group(pid, grace=grace)
    with contextlib.suppress(FileNotFoundError):
        (Path(workdir) / PID_NAME).unlink()
    return stopped


def start_server(plan: ServePlan, *, timeout: float = DEFAULT_START_TIMEOUT, **kwargs: Any) -> VllmServer:
    """Start a server for `plan` and wait until it answers (stops it again if it never does)."""
    server = VllmServer(plan, **kwargs).start()
    try:
        return server.wait_ready(timeout=timeout)
    except BaseException:
        server.stop()
        raise


class ServerPool:
    """Keeps up to `max_servers` live servers (default one); `get(plan)` reuses an equal one, else starts it.

    When a new server would exceed the limit, the least recently used one is stopped first, so tests and
    benchmarks never hold more memory than they need.
    """

    def __init__(self, *, max_servers: int = 1, timeout: float = DEFAULT_START_TIMEOUT, root: Path | None = None,
                 **server_kwargs: Any):
        self.max_servers = max(1, int(max_servers))
        self.timeout = timeout
        self.root = root
        self.server_kwargs = server_kwargs
        self.servers: dict[str, VllmServer] = {}
        self.start_seconds: dict[str, float] = {}

    def get(self, plan: ServePlan, **overrides: Any) -> VllmServer:
        key = plan.key() + json.dumps(overrides, sort_keys=True, default=str)
        server = self.servers.pop(key, None)
        if server is not None and server.running():
            self.servers[key] = server  # most recently used last
            return server
        while len(self.servers) >= self.max_servers:
            oldest = next(iter(self.servers))
            self.servers.pop(oldest).stop()
        kwargs = {**self.server_kwargs, **overrides}
        port = free_port(None)
        if self.root is not None:
            kwargs.setdefault("workdir", Path(self.root) / f"{plan.form}-{port}")
        server = start_server(plan, timeout=self.timeout, port=port, **kwargs)
        self.servers[key] = server
        self.start_seconds[key] = server.ready_after_s or 0.0
        return server

    def close(self) -> None:
        while self.servers:
            _, server = self.servers.popitem()
            server.stop()

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
