"""What the managed servers (vLLM, llama.cpp) share: a process group of their own, its log, PID and info files."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from engine.fsutil import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)


class ManagedServer:
    """A server process started in its own group, writing its log, PID and info files into its work folder."""

    FILES = ("server.log", "server.pid", "server.json")  # log, PID and info file names
    host: str
    port: int | None
    workdir: Path | None
    proc: subprocess.Popen | None = None
    started_at: float | None = None
    ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return (self.workdir or Path(".")) / self.FILES[0]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def stop(self, grace: float = 20.0) -> None:
        raise NotImplementedError

    def _spawn(self, argv: list[str], env: dict[str, str]):
        """Start `argv` in a new process group, its output appended to the log; write the PID and info files."""
        with open(self.log_path, "ab") as out:
            out.write(f"$ {shlex.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=self.workdir, start_new_session=True)
        self.started_at = time.time()
        atomic_write_text(self.workdir / self.FILES[1], f"{self.proc.pid}\n")
        atomic_write_json(self.workdir / self.FILES[2], self.describe())
        return self

    def _stop_group(self, grace: float) -> None:
        """SIGTERM to the process group (SIGKILL after `grace` s); the PID file goes."""
        stop_process_group(self.proc.pid, grace=grace, proc=self.proc)
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / self.FILES[1]).unlink()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_process_group(pgid: int, *, grace: float = 20.0, proc: subprocess.Popen | None = None) -> bool:
    """SIGTERM the group, wait up to `grace` s for it to empty, then SIGKILL. False if it was already gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        if proc is not None:
            proc.poll()
        return False
    deadline = time.time() + grace
    while time.time() < deadline:
        if proc is not None:
            proc.poll()
        if not _group_alive(pgid):
            return True
        time.sleep(0.2)
    log.warning("server (process group %d) ignored SIGTERM for %.0f s; killing it", pgid, grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a process group still has a live (not zombie) member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies still count for killpg; look for a live member
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
