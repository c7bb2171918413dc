"""`serve`: run real vLLM (from its own environment, created on first use) on a draft and its target.

By default the server runs as a background job (`python -m engine jobs` lists it, `jobs stop ID` ends it);
`--foreground` blocks until Ctrl-C. `--install-only` just creates the vLLM environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from engine.commands.flags import add_model_fields, options_from_args
from engine.commands.serve_common import abs_path, pick_port, wait_for_job
from engine.errors import WorkbenchError
from engine.jobs import JOB_DIR_ENV, launch, reporter, stop
from engine.serve.options import ServeOptions
from engine.serve.venv import ensure_vllm_env

START_PHASE = "starting the vLLM server"  # the job phase until the server answers; later starts here learn its time


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_fields(p, ServeOptions, title="serve")
    p.add_argument("--json", action="store_true", help="print one JSON object when the server is ready")


def run(args: argparse.Namespace) -> int:
    rep, o = reporter(), options_from_args(args, ServeOptions)

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)
        rep.update(message, progress=fraction * 0.5 if not o.install_only else fraction)

    if o.engine == "llama.cpp":
        from engine.commands.serve_llamacpp import serve_llamacpp

        return serve_llamacpp(o, as_json=args.json)
    plan = None if o.install_only else _plan(o)  # refuse bad arguments and drafts before installing
    env = ensure_vllm_env(progress=progress)
    if plan is None:
        print(f"vLLM {env.vllm_version} ({env.flavor}, torch {env.torch_version}) is installed in {env.path}")
        return 0
    if o.foreground or os.environ.get(JOB_DIR_ENV):
        return _serve_here(o, plan, env, as_json=args.json)
    return _serve_as_job(o, plan, as_json=args.json)


def _plan(o: ServeOptions):
    from engine.serve.server import plan_server

    if o.no_draft:
        if o.draft and o.target is None:
            from engine.format.checkpoint import read_config_dict

            o.target = read_config_dict(o.draft)["speculators_config"]["verifier"]["name_or_path"]
        if o.speculative_fields:
            raise WorkbenchError("--speculative-fields needs a draft", hint="drop --no-draft, or the fields")
        if o.per_request_spec_decode_metrics != "none":
            raise WorkbenchError("--per-request-spec-decode-metrics reports speculative decoding, and --no-draft "
                                 "serves none", hint="drop --no-draft, or the flag")
        return plan_server(target=o.target)
    if not o.draft:
        raise WorkbenchError("no draft given", hint="pass --draft DIR, or --no-draft to serve the target alone")
    return plan_server(o.draft, target=o.target, k=o.k, form=o.form, speculative_config=o.speculative_config(),
                       validate=not o.no_validate)




def _print_plan(plan, flags: list[str]) -> None:
    print(f"equivalent: {' '.join([plan.vllm_serve_line(), *flags])}")
    if plan.lossy:
        print(f"LOSSY: {plan.lossy}")
    report = plan.validation
    for line in getattr(report, "serve_commands", None) or []:
        print(f"  elsewhere: {line}")


def _serve_here(o: ServeOptions, plan, env, *, as_json: bool) -> int:
    from engine.serve.server import VllmServer

    rep = reporter()
    server = VllmServer(plan, o.settings(), port=pick_port(o), venv=env, extra_args=o.vllm_flags())
    _print_plan(plan, o.vllm_flags())
    try:
        server.start()
        rep.phase(START_PHASE, span=(0.5, 1.0))  # filled by what the last start here took (Reporter.beat)
        rep.update(f"starting vLLM on {server.url}", **server.describe())
        server.wait_ready(timeout=o.timeout, progress=rep.beat)
        info = {**server.describe(), "ready": True, "ready_after_s": round(server.ready_after_s or 0, 1),
                "memory_bytes": server.memory_bytes()}
        rep.phase("serving")
        rep.update(f"serving on {server.url}", progress=1.0, **info)
        print(json.dumps(info) if as_json else f"vLLM is serving on {server.url} (log: {server.log_path}); "
              "Ctrl-C stops it", flush=True)
        while server.running():
            time.sleep(1.0)
        raise server._failure(f"the vLLM server exited with code {server.proc.returncode}")
    except KeyboardInterrupt:
        rep.update(f"stopped the vLLM server on {server.url}", ready=False)
        raise
    finally:
        server.stop()


def _serve_as_job(o: ServeOptions, plan, *, as_json: bool) -> int:
    port = pick_port(o)
    argv = _job_argv(o, port)
    job = launch(argv, kind="serve", name=str(port))
    _print_plan(plan, o.vllm_flags())
    print(f"started job {job.id} ({job.dir}); waiting for vLLM on http://{o.host}:{port} ...", file=sys.stderr)
    deadline = time.time() + o.timeout + 60
    try:
        return wait_for_job(o, job, deadline, as_json=as_json)
    except KeyboardInterrupt:
        stop(job)  # Ctrl-C while waiting: do not leave a half-started server behind
        raise




def _job_argv(o: ServeOptions, port: int) -> list[str]:
    """The same command for the job, in the foreground, on the chosen port."""
    argv = ["serve", "--foreground", "--port", str(port), "--host", o.host, "--dtype", o.dtype,
            "--max-model-len", str(o.max_model_len), "--timeout", str(o.timeout)]
    for flag, value in (("--draft", abs_path(o.draft)), ("--target", abs_path(o.target)), ("--k", o.k),
                        ("--form", o.form), ("--kv-cache-gib", o.kv_cache_gib),
                        ("--speculative-fields", o.speculative_fields),
                        ("--per-request-spec-decode-metrics", o.per_request_spec_decode_metrics)):
        if value is not None:
            argv += [flag, str(value)]
    argv += [flag for flag, on in (("--no-draft", o.no_draft), ("--no-validate", o.no_validate)) if on]
    return argv

