"""`jobs`: list background jobs, show one, or stop one (SIGTERM to its process group)."""

from __future__ import annotations

import argparse
import json
import time
import typing

from engine.commands.flags import options_from_args
from engine.errors import WorkbenchError
from engine.jobs import JobsOptions, list_jobs, stop


def add_arguments(p: argparse.ArgumentParser) -> None:
    fields = JobsOptions.model_fields
    p.add_argument("action", nargs="?", default="list", choices=typing.get_args(fields["action"].annotation),
                   help=fields["action"].description)
    p.add_argument("job", nargs="?", help=fields["job"].description)
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    o = options_from_args(args, JobsOptions)
    jobs = list_jobs()
    if o.action == "list":
        if args.json:
            print(json.dumps([{"id": j.id, "kind": j.kind, "state": j.status.state, "message": j.status.message,
                               "progress": j.status.progress, "command": j.command} for j in jobs], indent=2))
        for j in [] if args.json else jobs:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(j.created))
            prog = f" {j.status.progress:.0%}" if j.status.progress is not None else ""
            print(f"{j.id:45s} {j.status.state:8s}{prog:5s} {when}  {j.status.message[:60]}")
        return 0
    match = [j for j in jobs if j.id == o.job]
    if not match:
        raise WorkbenchError(f"no job '{o.job}'", hint="run `python -m engine jobs` to list job ids")
    job = match[0]
    if o.action == "stop":
        print("stopping" if stop(job) else "already finished")
        return 0
    print(f"{job.id}: {job.status.state} {job.status.message}\n$ {job.command}\n{job.log_tail()}")
    return 0
