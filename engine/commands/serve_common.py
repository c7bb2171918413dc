"""What both engines' `serve` share: the port, a job waited on until its server is ready, paths for a job."""

from __future__ import annotations

import json
import os
import time

from engine.errors import WorkbenchError
from engine.jobs import load_job, stop
from engine.serve.options import ServeOptions


def pick_port(o: ServeOptions) -> int:
    """--port if it is free (refused if not), else 8000 or the first free one."""
    from engine.serve.server import free_port

    if o.port is None:
        return free_port(8000, o.host)
    if free_port(o.port, o.host) != o.port:
        raise WorkbenchError(f"port {o.port} is already in use", hint="choose another --port, or omit it")
    return o.port


def wait_for_job(o: ServeOptions, job, deadline: float, *, as_json: bool, engine: str = "vLLM",
                 log_name: str = "vllm.log") -> int:
    """Until the serve job says its server is ready (print its facts), fails, or outlasts `deadline` (stopped)."""
    while True:
        current = load_job(job.dir) or job
        if current.status.result.get("ready"):
            info = {**current.status.result, "job": current.id}
            print(json.dumps(info) if as_json else f"{engine} is serving on {info['url']} (job {current.id}); stop "
                  f"it with `python -m engine jobs stop {current.id}`")
            return 0
        if not current.running:
            raise WorkbenchError(f"the serve job {current.id} {current.status.state}: {current.status.message}",
                                 hint=f"see {current.dir / 'stdout.log'} and {current.dir / log_name}")
        if time.time() > deadline:
            stop(current)
            raise WorkbenchError(f"{engine} was not ready after {o.timeout:.0f} s (job {current.id} stopped)",
                                 hint=f"see {current.dir / log_name}; raise --timeout on a slow machine")
        time.sleep(1.0)


def abs_path(path: str | None) -> str | None:
    """Local paths made absolute (the job may run elsewhere); names and hub ids unchanged."""
    from engine.targets.resolve import BUILTIN_TARGETS

    if not path or path in BUILTIN_TARGETS or not os.path.exists(path):
        return path
    return os.path.abspath(path)
