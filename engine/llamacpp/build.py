"""Build (once) llama.cpp's server from the pinned PyPI source, cached outside the clone per version and CPU."""

# The registry has llama.cpp only as source: the sdist of `llama-cpp-python` vendors its whole tree. `ensure_llamacpp`
# downloads that sdist, unpacks `vendor/llama.cpp`, and builds `llama-server` with CMake for this CPU (GGML_NATIVE),
# so the cache key holds the CPU's flags too. A stamp file marks a finished build; an interrupted one resumes (CMake
# rebuilds only what is missing). The unpacked source is kept: its `convert_hf_to_gguf.py` and `gguf-py` export GGUFs.

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.cpu import cpu_flags, cpu_kind
from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_json, exclusive_lock, read_json, workbench_home

log = logging.getLogger(__name__)

SOURCE_DIST = "llama-cpp-python"
SOURCE_VERSION = "0.3.36"  # its vendor/llama.cpp is the llama.cpp the workbench builds and tests against
HOME_ENV = "WORKBENCH_LLAMACPP_HOME"  # where builds are cached (default: <workbench home>/llama.cpp)
SDIST_ENV = "WORKBENCH_LLAMACPP_SDIST"  # a local copy of the sdist (no download)
STAMP = ".workbench-llamacpp.json"
STAMP_FORMAT = 1
TARGETS = ("llama-server",)
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF")
_STEP = re.compile(r"^\[(\d+)/(\d+)\]")  # Ninja's "[12/210] Building ..."
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")  # Make's "[ 42%] Building ..."

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class LlamaCpp:
    """A finished build: its folder, the llama.cpp source it was built from, and how long the build took."""

    path: Path
    version: str
    build_seconds: float | None = None

    @property
    def source(self) -> Path:
        return self.path / "src"

    @property
    def server(self) -> Path:
        return self.path / "build" / "bin" / "llama-server"

    @property
    def converter(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    def converter_env(self) -> dict[str, str]:
        """The environment in which its converter imports its own `gguf` (not the older one installed here)."""
        paths = [str(self.source / "gguf-py"), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "NO_LOCAL_GGUF": ""}


def llamacpp_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or workbench_home() / "llama.cpp").expanduser().absolute()


def build_key(version: str = SOURCE_VERSION) -> str:
    """The version and a digest of this CPU's flags: a native build runs only where its instructions exist."""
    digest = hashlib.sha1(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:8]
    return f"{version}-{cpu_kind().lower().replace(' ', '').replace('-', '')}-{digest}"


def build_dir(version: str = SOURCE_VERSION) -> Path:
    return llamacpp_home() / build_key(version)


def read_stamp(path: Path | None = None) -> LlamaCpp | None:
    """The finished build at `path` (default: this CPU's build of the pinned version), or None."""
    path = path or build_dir()
    try:
        data = read_json(path / STAMP)
    except (OSError, ValueError):
        return None
    found = LlamaCpp(path, data.get("version", "?"), data.get("seconds"))
    if data.get("format") != STAMP_FORMAT or not os.access(found.server, os.X_OK) or not found.converter.is_file():
        return None
    return found


def ensure_llamacpp(progress: Progress | None = None, *, version: str = SOURCE_VERSION) -> LlamaCpp:
    """This CPU's build of llama.cpp, built first if needed (minutes, once; resumes if interrupted)."""
    path = build_dir(version)
    done = read_stamp(path)
    if done is not None:
        return done
    report = progress or (lambda message, fraction: None)
    tools_missing()
    with exclusive_lock(path.with_name(f".{path.name}.lock"), on_wait=lambda: report(
            f"another process is building llama.cpp in {path}; waiting", 0.0)):
        done = read_stamp(path)
        if done is not None:
            return done
        started = time.time()
        sdist = _sdist(path.parent / "downloads", version, report)
        _unpack(sdist, path / "src", report)
        _compile(path, report)
        seconds = round(time.time() - started, 1)
        atomic_write_json(path / STAMP, {"format": STAMP_FORMAT, "version": version, "source": SOURCE_DIST,
                                         "targets": list(TARGETS), "cmake_flags": list(CMAKE_FLAGS),
                                         "cpu_kind": cpu_kind(), "built": time.time(), "seconds": seconds})
        report(f"llama.cpp ({SOURCE_DIST} {version}) built in {path} ({seconds:.0f} s)", 1.0)
        return LlamaCpp(path, version, seconds)


def tools_missing() -> None:
    """Refuse up front, naming what to install, when CMake or a C++ compiler is missing."""
    missing = [tool for tool in ("cmake",) if shutil.which(tool) is None]
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    if missing:
        raise WorkbenchError(f"building llama.cpp needs {' and '.join(missing)}, not found on this machine",
                             hint="install them (Debian/Ubuntu: sudo apt-get install cmake g++ ninja-build), "
                                  "then run the command again")


def _sdist(downloads: Path, version: str, report: Progress) -> Path:
    """The source archive: $WORKBENCH_LLAMACPP_SDIST, an earlier download, or one from the package index."""
    given = os.environ.get(SDIST_ENV)
    if given:
        if not Path(given).is_file():
            raise WorkbenchError(f"{SDIST_ENV}={given} is not a file", hint=f"point it at {SOURCE_DIST}-{version}"
                                 ".tar.gz, or unset it to download the source")
        return Path(given)
    name = f"{SOURCE_DIST.replace('-', '_')}-{version}.tar.gz"
    if (downloads / name).is_file():
        return downloads / name
    report(f"downloading the llama.cpp source ({SOURCE_DIST}=={version}, about 75 MB)", 0.01)
    tmp = downloads / f".partial-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
              "--no-binary=:all:", f"{SOURCE_DIST}=={version}", "-d", str(tmp)], "download the llama.cpp source",
             hint="check the access to the package index (PyPI), then run the command again")
        got = next(tmp.glob("*.tar.gz"), None)
        if got is None:
            raise WorkbenchError(f"pip downloaded no source archive of {SOURCE_DIST}=={version}",
                                 hint=f"download it yourself and set {SDIST_ENV} to its path")
        os.replace(got, downloads / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return downloads / name


def _unpack(sdist: Path, dest: Path, report: Progress) -> None:
    """`vendor/llama.cpp/` of the archive into `dest` (whole, or not at all)."""
    if (dest / "CMakeLists.txt").is_file() and (dest / "convert_hf_to_gguf.py").is_file():
        return
    report(f"unpacking llama.cpp from {sdist.name}", 0.04)
    tmp = dest.with_name(f".src-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split("/")[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            if not members:
                raise WorkbenchError(f"{sdist} holds no vendor/llama.cpp", hint=f"use {SOURCE_DIST}'s sdist")
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(tmp, members=[m for m in members if m.name], filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WorkbenchError(f"could not unpack {sdist}: {exc}", hint="delete it and run the command again") from exc
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def _compile(path: Path, report: Progress) -> None:
    """CMake configure and build of TARGETS, its step counter turned into progress (5% to 99%)."""
    build = path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    if not (build / "CMakeCache.txt").is_file():
        report("configuring the llama.cpp build (CMake)", 0.05)
        _run(["cmake", "-S", str(path / "src"), "-B", str(build), *generator, *CMAKE_FLAGS], "configure llama.cpp",
             hint="read the CMake output above; a missing compiler or CMake is named there")
    jobs = str(max(1, os.cpu_count() or 1))
    report(f"compiling llama-server on {jobs} cores (about 10 min on 2 cores, once)", 0.06)
    _run(["cmake", "--build", str(build), "--target", *TARGETS, "-j", jobs], "build llama.cpp",
         hint="read the compiler output above; run the command again to resume the build", progress=lambda line:
         _build_fraction(line, report))


def _build_fraction(line: str, report: Progress) -> None:
    step, percent = _STEP.match(line), _PERCENT.match(line)
    if step:
        fraction = int(step.group(1)) / max(1, int(step.group(2)))
    elif percent:
        fraction = int(percent.group(1)) / 100
    else:
        return
    report(f"compiling llama.cpp: {line.split(']', 1)[0].strip('[')} ", 0.06 + 0.93 * fraction)


def _run(argv: list[str], what: str, *, hint: str, progress: Callable[[str], None] | None = None) -> None:
    """Run one step; its output goes to the debug log; a failure raises with the last lines."""
    log.debug("$ %s", " ".join(argv))
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    except OSError as exc:
        raise WorkbenchError(f"could not {what}: {exc}", hint=hint) from exc
    lines: list[str] = []
    assert proc.stdout is not None
    last = 0.0
    for line in proc.stdout:
        lines.append(line.rstrip())
        if progress is not None and time.monotonic() - last > 1.0:
            last = time.monotonic()
            progress(line.strip())
    if proc.wait() != 0:
        tail = "\n".join(lines[-25:])
        raise WorkbenchError(f"could not {what} (exit code {proc.returncode}):\n{tail}", hint=hint)
