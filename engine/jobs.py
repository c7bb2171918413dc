"""Background jobs as directories: `runs/<id>/` holds the command, logs, `status.json` and metrics.

A job is `python -m engine <command> ...` started in its own process group. The child reports its
own progress through `reporter()` (a no-op outside a job), writing `status.json` atomically, so the
UI can rebuild the job list from disk after a refresh or an app restart. Stopping sends SIGTERM to
the process group (trainers checkpoint on it). `DirLock` keeps two jobs from writing into one folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_json, atomic_write_text, read_json
from engine.options import Options

JOB_DIR_ENV = "WORKBENCH_JOB_DIR"
STATUS = "status.json"
FINAL_STATES = ("done", "failed", "stopped")


def runs_dir() -> Path:
    """Where job directories live: $WORKBENCH_RUNS or ./runs."""
    return Path(os.environ.get("WORKBENCH_RUNS", "runs")).resolve()


@dataclass
class JobStatus:
    state: str = "queued"  # queued | running | done | failed | stopped
    message: str = ""
    progress: float | None = None  # 0..1
    pid: int | None = None
    started: float | None = None
    updated: float | None = None
    result: dict[str, Any] = field(default_factory=dict)
    # the job's named phases in order: {"name", "start", "end" (None while it runs), "units" (items, steps or None)};
    # later jobs of the same kind learn their time estimates from them (learned_seconds)
    phases: list[dict[str, Any]] = field(default_factory=list)
    # the phases still to come, as the job planned them: {"name", "units"}; the time left adds what each took here
    plan: list[dict[str, Any]] = field(default_factory=list)


class Reporter:
    """Written by the job itself. Every update rewrites status.json atomically."""

    def __init__(self, job_dir: Path | None):
        self.job_dir = job_dir
        self.status = JobStatus(state="running", pid=os.getpid(), started=time.time())
        # process start, imports and set-up until the command names its first phase
        self.status.phases.append({"name": "starting", "start": self.status.started, "end": None, "units": None})
        if job_dir is not None:
            try:
                old = read_json(job_dir / STATUS)
                self.status.started = old.get("started") or self.status.started
            except (OSError, ValueError):
                pass
            self._write()

    @property
    def active(self) -> bool:
        return self.job_dir is not None

    def _write(self) -> None:
        if self.job_dir is None:
            return
        self.status.updated = time.time()
        atomic_write_json(self.job_dir / STATUS, asdict(self.status))

    def update(self, message: str | None = None, progress: float | None = None, **result: Any) -> None:
        if message is not None:
            self.status.message = message
        if progress is not None:
            self.status.progress = max(0.0, min(1.0, float(progress)))
        self.status.result.update(result)
        self._write()

    def phase(self, name: str, units: int | None = None, *, message: str | None = None,
              progress: float | None = None, span: tuple[float, float] | None = None) -> None:
        """Start the phase `name` (the previous one ends): `units` of its size (items, prompts × tokens, timed
        forwards); its message is `name` unless given; `span`: the share of the bar its steps fill. What it takes is
        what later jobs of the same kind here expect it to take (learned_seconds)."""
        now = time.time()
        self._end_phase(now)
        self.status.phases.append({"name": name, "start": now, "end": None, "units": units,
                                   **({"span": list(span)} if span else {}), "expected_s": self._expected(name, units)})
        names = [p.get("name") for p in self.status.plan]
        if name in names:  # a planned phase has come
            del self.status.plan[names.index(name)]
        self.update(name if message is None else message, span[0] if span and progress is None else progress)

    def _expected(self, name: str, units: int | None) -> float | None:
        """What phase `name` of this size took in the last job of this kind here (learned_seconds); None if none."""
        if self.job_dir is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            kind = read_json(self.job_dir / "job.json").get("kind")
            learned = learned_seconds(kind, name, units, root=self.job_dir.parent, exclude=self.job_dir.name)
            return learned[0] if learned else None
        return None

    def beat(self, message: str | None = None) -> None:
        """A phase with no steps to count is still working: its bar fills by the time its last run here took (at most
        95% of its span), or, on a first run, creeps towards 90% of it."""
        ph = self.status.phases[-1]
        lo, hi = ph.get("span") or (self.status.progress or 0.0,) * 2
        elapsed, expected = time.time() - ph["start"], ph.get("expected_s")
        share = min(0.95, elapsed / expected) if expected else min(0.9, elapsed / (elapsed + 60.0))
        self.update(message, lo + (hi - lo) * share)

    def plan(self, phases: Sequence[tuple[str, int | None]]) -> None:
        """Name the phases still to come and their sizes, so the time left counts them from the start."""
        self.status.plan = [{"name": name, "units": units} for name, units in phases]
        self._write()

    def step(self, done: int, total: int) -> None:
        """`done` of the current phase's `total` steps (a retry may raise it): its message, the bar within its span,
        and its own estimate of the time left. The phase keeps the size it started with, so a later run expects the
        retries this one needed."""
        ph = self.status.phases[-1]
        lo, hi = ph.get("span") or (self.status.progress or 0.0,) * 2
        self.update(f"{ph['name']}: {done}/{total} {self.own_estimate(done, total)}".rstrip(),
                    lo + (hi - lo) * min(1.0, done / total) if total else None)

    def own_estimate(self, done: int, total: int) -> str:
        """The current phase's time left at its own rate, kept with the phase ("left_s", "left_at") and worded
        ("(about 40 s left)"; "" before it has done anything)."""
        ph, now = self.status.phases[-1], time.time()
        if done > 0 and total:
            ph["left_s"], ph["left_at"] = (now - ph["start"]) / done * max(0, total - done), now
        return left_text(done, total, now - ph["start"])

    def _end_phase(self, now: float) -> None:
        if self.status.phases and self.status.phases[-1].get("end") is None:
            self.status.phases[-1]["end"] = now

    def finish(self, state: str = "done", message: str = "", **result: Any) -> None:
        self._end_phase(time.time())
        self.status.state = state
        self.status.message = message or self.status.message
        if state == "done":
            self.status.progress = 1.0
        self.status.result.update(result)
        self._write()


_REPORTER: Reporter | None = None


def reporter() -> Reporter:
    """The current process's reporter (writes into $WORKBENCH_JOB_DIR when run as a job)."""
    global _REPORTER
    if _REPORTER is None:
        # under torchrun only rank 0 reports (every rank inherits the job's environment)
        d = os.environ.get(JOB_DIR_ENV) if os.environ.get("RANK", "0") == "0" else None
        _REPORTER = Reporter(Path(d) if d else None)
    return _REPORTER


def duration_text(seconds: float) -> str:
    """"45 s", "3 min 20 s", "1 h 05 min": a duration as people read it."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def left_text(done: float, total: float, elapsed: float) -> str:
    """"(about 40 s left)" from the phase's own rate once it has done something, else "": before that the UI counts
    down what the same phase took here before (learned_seconds), or says "estimating…"."""
    if done > 0 and total:
        return f"(about {duration_text(elapsed / done * max(0.0, total - done))} left)"
    return ""


def tracked(iterable: Any, *, desc: str, total: int | None = None, span: tuple[float, float] | None = (0.0, 1.0),
            unit: str = "it", enabled: bool = True, every_s: float = 1.0, units: int | None = None) -> Any:
    """A tqdm bar over `iterable` that also writes the job's progress into status.json: "desc: 3/10 (about 40 s
    left)", its fraction scaled into `span` of the whole job (a job of several phases), at most every `every_s`;
    span None: the bar only (a caller that reports its own progress). `units`: the phase's size for later
    estimates (e.g. prompts × tokens), the item count unless given."""
    from tqdm import tqdm

    rep = reporter() if span is not None else Reporter(None)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    lo, hi = span or (0.0, 1.0)
    start = last = time.monotonic()
    if rep.active:  # a named phase of `total` items: later jobs of this kind learn what it takes here
        rep.phase(desc, units or total, progress=lo, message=f"{desc}: 0/{total}" if total else desc)
    done = 0
    for item in tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True):
        yield item
        done += 1
        now = time.monotonic()
        if rep.active and (now - last >= every_s or done == total):
            last = now
            if total:
                rep.update(f"{desc}: {done}/{total} " + (rep.own_estimate(done, total) if done < total
                                                        else f"({duration_text(now - start)})"),
                           lo + (hi - lo) * done / total)
            else:
                rep.update(f"{desc}: {done} done ({duration_text(now - start)})")


class Ticks:
    """Counts the units of the current phase done (call it once per unit) and reports (done, total) through
    `on_step` (the job's Reporter.step unless given) at most every `every_s`, and at the end."""

    def __init__(self, total: int, on_step: Any = None, every_s: float = 0.5):
        self.total, self.on_step, self.every_s = total, on_step or reporter().step, every_s
        self.done, self.last = 0, 0.0

    def __call__(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            self.on_step(self.done, self.total)


def learned_seconds(kind: str | None, phase: str, units: int | None = None, *, root: Path | None = None,
                    exclude: str | None = None) -> tuple[float, str] | None:
    """(seconds, job id): how long phase `phase` took in the newest finished job of `kind` on this machine (its
    runs folder), scaled to `units` when both know their units; None when no such job here ran that phase."""
    for job in list_jobs(root):
        if job.kind != kind or job.status.state not in ("done", "stopped") or job.id == exclude:
            continue
        # a stopped job's last phase was cut short (a server stopped while serving): not a measurement
        for ph in job.status.phases[:-1] if job.status.state == "stopped" else job.status.phases:
            if ph.get("name") == phase and ph.get("end") and ph.get("start"):
                seconds = float(ph["end"]) - float(ph["start"])
                if units and ph.get("units"):
                    seconds *= units / ph["units"]
                return seconds, job.id
    return None


def learned_rest(kind: str | None, phase: str, *, root: Path | None = None,
                 exclude: str | None = None) -> tuple[float, str] | None:
    """(seconds, job id): how long the phases after `phase` took in the newest finished job of `kind` here that ran
    `phase`; None when none did."""
    for job in list_jobs(root):
        if job.kind != kind or job.status.state != "done" or job.id == exclude:
            continue
        names = [ph.get("name") for ph in job.status.phases]
        if phase in names:
            later = job.status.phases[names.index(phase) + 1:]
            return sum(float(ph["end"]) - float(ph["start"]) for ph in later if ph.get("end")), job.id
    return None


def learned_plan(kind: str | None, plan: Sequence[tuple[str, int | None]], *, root: Path | None = None,
                 exclude: str | None = None) -> tuple[float, list[str]]:
    """(seconds, phases never run here): what the planned phases (name, units) took in this machine's last jobs
    of `kind`, each scaled to its units; the phases no such job ran are named instead."""
    seconds, unknown = 0.0, []
    for name, units in plan:
        learned = learned_seconds(kind, name, units, root=root, exclude=exclude)
        if learned is None:
            unknown.append(name)
        else:
            seconds += learned[0]
    return seconds, unknown


@dataclass
class Job:
    """A job directory as seen from outside (the UI, `python -m engine jobs`)."""

    id: str
    dir: Path
    kind: str
    argv: list[str]
    created: float
    status: JobStatus
    launcher: list[str] | None = None  # e.g. torchrun's module and flags; None: `python -m engine`

    @property
    def command(self) -> str:
        return launcher_command(self.launcher) + " " + shlex.join(self.argv)

    @property
    def running(self) -> bool:
        return self.status.state in ("queued", "running")

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.dir / "stdout.log", lines)

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.dir / "metrics.jsonl")


def launcher_command(launcher: Sequence[str] | None) -> str:
    """How a job's argv is run, as a shell prefix: `python -m engine` or `torchrun ... -m engine`."""
    if not launcher:
        return "python -m engine"
    parts = list(launcher)
    if parts[:2] == ["-m", "torch.distributed.run"]:
        parts = ["torchrun", *parts[2:]]
    return shlex.join([*parts, "-m", "engine"])


def tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    # tqdm writes carriage returns; keep the last state of each line
    out = [ln.split("\r")[-1] for ln in data.splitlines()]
    return "\n".join(out[-lines:])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line being written right now
    except OSError:
        pass
    return rows


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of this process counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def load_job(job_dir: Path) -> Job | None:
    try:
        meta = read_json(job_dir / "job.json")
    except (OSError, ValueError):
        return None
    try:
        status = JobStatus(**read_json(job_dir / STATUS))
    except (OSError, ValueError, TypeError):
        status = JobStatus()
    if status.state in ("queued", "running") and not _pid_alive(status.pid or meta.get("pid")):
        if time.time() - meta.get("created", 0) > 10 or status.pid:
            status.state = "failed"
            status.message = status.message or "the process ended without reporting (see stdout.log)"
    return Job(id=job_dir.name, dir=job_dir, kind=meta.get("kind", "?"), argv=meta.get("argv", []),
               created=meta.get("created", 0.0), status=status, launcher=meta.get("launcher"))


def list_jobs(root: Path | None = None) -> list[Job]:
    """All jobs under `root` (newest first), rebuilt from disk."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    jobs = [load_job(d) for d in root.iterdir() if d.is_dir() and (d / "job.json").is_file()]
    return sorted((j for j in jobs if j is not None), key=lambda j: j.created, reverse=True)


def _provenance(argv: Sequence[str], launcher: Sequence[str] | None = None) -> str:
    sha = ""
    with contextlib.suppress(Exception):
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], timeout=5).stdout.strip()
    versions = []
    for mod in ("torch", "transformers"):
        with contextlib.suppress(Exception):
            versions.append(f"{mod}=={__import__(mod).__version__}")
    return (f"{launcher_command(launcher)} {shlex.join(argv)}\n# git {sha or 'unknown'}; "
            f"python {platform.python_version()}; {' '.join(versions)}\n")


def launch(argv: Sequence[str], *, kind: str | None = None, name: str | None = None, root: Path | None = None,
           env: dict[str, str] | None = None, launcher: Sequence[str] | None = None) -> Job:
    """Start `python -m engine <argv>` as a job in its own process group; return at once.

    `launcher` runs it through a Python module instead, e.g. `["-m", "torch.distributed.run", "--standalone",
    "--nproc-per-node", "2"]` for `python -m torch.distributed.run ... -m engine <argv>` (torchrun)."""
    root = root or runs_dir()
    kind = kind or argv[0]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job_dir = root / f"{stamp}_{kind}{'_' + name if name else ''}"
    n = 1
    while job_dir.exists():
        n += 1
        job_dir = root / f"{stamp}_{kind}{'_' + name if name else ''}-{n}"
    job_dir.mkdir(parents=True)
    argv = list(argv)
    launcher = list(launcher) if launcher else None
    atomic_write_text(job_dir / "command.txt", _provenance(argv, launcher))
    atomic_write_json(job_dir / STATUS, asdict(JobStatus(state="queued", updated=time.time())))
    child_env = {**os.environ, **(env or {}), JOB_DIR_ENV: str(job_dir), "PYTHONUNBUFFERED": "1"}
    repo = Path(__file__).resolve().parents[1]
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), child_env.get("PYTHONPATH", "")) if p)
    with open(job_dir / "stdout.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, *(launcher or []), "-m", "engine", *argv], stdout=log,
                                stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=child_env, start_new_session=True)
    atomic_write_json(job_dir / "job.json", {"kind": kind, "argv": argv, "created": time.time(), "pid": proc.pid,
                                             "pgid": proc.pid, **({"launcher": launcher} if launcher else {})})
    return load_job(job_dir)  # type: ignore[return-value]


def stop(job: Job, sig: int = signal.SIGTERM) -> bool:
    """Signal the job's whole process group (SIGTERM lets trainers checkpoint). False if already gone."""
    pgid = read_json(job.dir / "job.json").get("pgid")
    try:
        os.killpg(int(pgid), sig)
        return True
    except (ProcessLookupError, TypeError, ValueError):
        return False


def wait(job: Job, timeout: float | None = None, poll: float = 0.5) -> Job:
    """Block until the job reaches a final state (or the timeout); return its latest view."""
    deadline = None if timeout is None else time.time() + timeout
    while True:
        current = load_job(job.dir) or job
        if not current.running:
            return current
        if deadline is not None and time.time() > deadline:
            return current
        time.sleep(poll)


class DirLock:
    """An exclusive lock on an output folder (`.workbench.lock`), held while a job writes into it."""

    def __init__(self, folder: str | os.PathLike, what: str = "this job"):
        self.folder = Path(folder)
        self.what = what
        self._fd: int | None = None

    def __enter__(self) -> DirLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / ".workbench.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.read(fd, 200).decode(errors="replace").strip()
            os.close(fd)
            raise WorkbenchError(f"{self.folder} is in use by another job ({holder or 'unknown process'})",
                                 hint="wait for it to finish, stop it, or choose another output folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}: {self.what}".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class JobsOptions(Options):
    """`jobs`: list the background jobs, show one, or stop one."""

    action: Literal["list", "show", "stop"] = Field("list", description="list the jobs, show one (its command, state "
                                                    "and log tail), or stop one (SIGTERM to its process group)")
    job: str | None = Field(None, description="job id (folder name under runs/) for show/stop")
