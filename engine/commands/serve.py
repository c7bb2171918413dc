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

from engine.errors import WorkbenchError
from engine.jobs import JOB_DIR_ENV, launch, load_job, reporter, stop

READY_TIMEOUT = 900.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=None, help="draft folder (speculators format) to serve with its target")
    p.add_argument("--target", default=None,
                   help="built-in name, local folder or hub id of the target (default: the draft's verifier)")
    p.add_argument("--k", type=int, default=None, help="tokens drafted per step (default: the draft's own)")
    p.add_argument("--port", type=int, default=None, help="port to listen on (default: 8000, or a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--no-draft", action="store_true", help="serve the target alone (no speculative decoding)")
    p.add_argument("--form", choices=["auto", "explicit"], default=None,
                   help="auto: the draft folder is the model (vLLM reads its verifier); explicit: the target with "
                   "--speculative-config (default: auto when the target is the draft's verifier)")
    p.add_argument("--no-validate", action="store_true", help="do not refuse a draft our validator rejects")
    p.add_argument("--dtype", default="bfloat16", help="weights/activations dtype on CPU (default: bfloat16)")
    p.add_argument("--max-model-len", type=int, default=2048, help="context length (default: 2048)")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="CPU KV cache in GiB (default: 2)")
    p.add_argument("--timeout", type=float, default=READY_TIMEOUT, help="seconds to wait for the server to be ready")
    p.add_argument("--install-only", action="store_true", help="create the vLLM environment and exit")
    p.add_argument("--foreground", action="store_true", help="serve in this process until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print one JSON object when the server is ready")


def run(args: argparse.Namespace) -> int:
    from engine.serve.venv import ensure_vllm_env

    rep = reporter()

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)
        rep.update(message, progress=fraction * 0.5 if not args.install_only else fraction)

    plan = None if args.install_only else _plan(args)  # refuse bad arguments and drafts before installing
    env = ensure_vllm_env(progress=progress)
    if plan is None:
        print(f"vLLM {env.vllm_version} ({env.flavor}, torch {env.torch_version}) is installed in {env.path}")
        return 0
    if args.foreground or os.environ.get(JOB_DIR_ENV):
        return _serve_here(args, plan, env)
    return _serve_as_job(args, plan)


def _plan(args: argparse.Namespace):
    from engine.serve.server import plan_server

    if args.no_draft:
        if args.draft and args.target is None:
            from engine.format.checkpoint import read_config_dict

            args.target = read_config_dict(args.draft)["speculators_config"]["verifier"]["name_or_path"]
        return plan_server(target=args.target)
    if not args.draft:
        raise WorkbenchError("no draft given", hint="pass --draft DIR, or --no-draft to serve the target alone")
    return plan_server(args.draft, target=args.target, k=args.k, form=args.form, validate=not args.no_validate)


def _port(args: argparse.Namespace) -> int:
    from engine.serve.server import free_port

    if args.port is None:
        return free_port(8000, args.host)
    if free_port(args.port, args.host) != args.port:
        raise WorkbenchError(f"port {args.port} is already in use", hint="choose another --port, or omit it")
    return args.port


def _print_plan(plan) -> None:
    print(f"equivalent: {plan.vllm_serve_line()}")
    report = plan.validation
    for line in getattr(report, "serve_commands", None) or []:
        print(f"  elsewhere: {line}")


def _serve_here(args: argparse.Namespace, plan, env) -> int:
    from engine.serve.server import VllmServer

    rep = reporter()
    server = VllmServer(plan, port=_port(args), host=args.host, venv=env, max_model_len=args.max_model_len,
                        kv_cache_gib=args.kv_cache_gib, dtype=args.dtype)
    _print_plan(plan)
    try:
        server.start()
        rep.update(f"starting vLLM on {server.url}", progress=0.5, **server.describe())
        server.wait_ready(timeout=args.timeout, progress=lambda m: rep.update(m))
        info = {**server.describe(), "ready": True, "ready_after_s": round(server.ready_after_s or 0, 1),
                "memory_bytes": server.memory_bytes()}
        rep.update(f"serving on {server.url}", progress=1.0, **info)
        print(json.dumps(info) if args.json else f"vLLM is serving on {server.url} (log: {server.log_path}); "
              "Ctrl-C stops it", flush=True)
        while server.running():
            time.sleep(1.0)
        raise server._failure(f"the vLLM server exited with code {server.proc.returncode}")
    except KeyboardInterrupt:
        rep.update(f"stopped the vLLM server on {server.url}", ready=False)
        raise
    finally:
        server.stop()


def _serve_as_job(args: argparse.Namespace, plan) -> int:
    port = _port(args)
    argv = _job_argv(args, port)
    job = launch(argv, kind="serve", name=str(port))
    _print_plan(plan)
    print(f"started job {job.id} ({job.dir}); waiting for vLLM on http://{args.host}:{port} ...", file=sys.stderr)
    deadline = time.time() + args.timeout + 60
    try:
        return _wait_for_job(args, job, deadline)
    except KeyboardInterrupt:
        stop(job)  # Ctrl-C while waiting: do not leave a half-started server behind
        raise


def _wait_for_job(args: argparse.Namespace, job, deadline: float) -> int:
    while True:
        current = load_job(job.dir) or job
        if current.status.result.get("ready"):
            info = {**current.status.result, "job": current.id}
            print(json.dumps(info) if args.json else f"vLLM is serving on {info['url']} (job {current.id}); stop it "
                  f"with `python -m engine jobs stop {current.id}`")
            return 0
        if not current.running:
            raise WorkbenchError(f"the serve job {current.id} {current.status.state}: {current.status.message}",
                                 hint=f"see {current.dir / 'stdout.log'} and {current.dir / 'vllm.log'}")
        if time.time() > deadline:
            stop(current)
            raise WorkbenchError(f"vLLM was not ready after {args.timeout:.0f} s (job {current.id} stopped)",
                                 hint=f"see {current.dir / 'vllm.log'}; raise --timeout on a slow machine")
        time.sleep(1.0)


def _job_argv(args: argparse.Namespace, port: int) -> list[str]:
    """The same command for the job, in the foreground, on the chosen port."""
    argv = ["serve", "--foreground", "--port", str(port), "--host", args.host, "--dtype", args.dtype,
            "--max-model-len", str(args.max_model_len), "--timeout", str(args.timeout)]
    for flag, value in (("--draft", _abs(args.draft)), ("--target", _abs(args.target)), ("--k", args.k),
                        ("--form", args.form), ("--kv-cache-gib", args.kv_cache_gib)):
        if value is not None:
            argv += [flag, str(value)]
    argv += [flag for flag, on in (("--no-draft", args.no_draft), ("--no-validate", args.no_validate)) if on]
    return argv


def _abs(path: str | None) -> str | None:
    """Local paths made absolute (the job may run elsewhere); names and hub ids unchanged."""
    from engine.targets import BUILTIN_TARGETS

    if not path or path in BUILTIN_TARGETS or not os.path.exists(path):
        return path
    return os.path.abspath(path)
