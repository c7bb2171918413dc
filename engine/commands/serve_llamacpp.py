"""`serve --engine llama.cpp`: llama-server on the target's GGUF with the draft exported for it, as a job or here."""

from __future__ import annotations

import json
import os
import sys
import time

from engine.commands.serve_common import abs_path, pick_port, wait_for_job
from engine.errors import WorkbenchError
from engine.jobs import JOB_DIR_ENV, launch, reporter, stop
from engine.llamacpp.build import ensure_llamacpp
from engine.llamacpp.server import LOG_NAME, LlamaPlan, LlamaServer
from engine.serve.options import ServeOptions

START_PHASE = "starting llama-server"  # the job phase until the server answers; later starts here learn its time


def serve_llamacpp(o: ServeOptions, *, as_json: bool) -> int:
    rep = reporter()

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)
        rep.update(message, progress=fraction * 0.5)

    if o.install_only:
        build = ensure_llamacpp(progress)
        print(f"llama.cpp ({build.version}) is built in {build.path}" + (
            f" (the build took {build.build_seconds:.0f} s)" if build.build_seconds else ""))
        return 0
    if o.foreground or os.environ.get(JOB_DIR_ENV):
        return _serve_here(o, plan_llamacpp(o, progress), as_json=as_json)
    plan_llamacpp(o, progress)  # refuse a bad draft or setting, and build and export, before the job starts
    port = pick_port(o)
    update = {"foreground": True, "port": port, "draft": abs_path(o.draft), "target": abs_path(o.target)}
    job = launch(o.model_copy(update={k: v for k, v in update.items() if v is not None}).argv("serve"),
                 kind="serve", name=str(port))
    print(f"started job {job.id} ({job.dir}); waiting for llama-server on http://{o.host}:{port} ...",
          file=sys.stderr)
    try:
        return wait_for_job(o, job, time.time() + o.timeout + 60, as_json=as_json, engine="llama.cpp",
                             log_name=LOG_NAME)
    except KeyboardInterrupt:
        stop(job)
        raise


def plan_llamacpp(o: ServeOptions, progress=None) -> LlamaPlan:
    """The llama-server plan of `serve` options: the target's GGUF, the draft's (exported once), the types and k."""
    from engine.format.checkpoint import read_config_dict
    from engine.llamacpp.gguf import export_draft, target_gguf
    from engine.targets.identity import target_for_draft

    if o.no_draft and o.p_min is not None:
        raise WorkbenchError("--p-min stops a draft's chain, and --no-draft serves none", hint="drop one of them")
    if not o.no_draft and not o.draft:
        raise WorkbenchError("no draft given", hint="pass --draft DIR, or --no-draft (with --ngram for n-gram only)")
    target = o.target
    if o.draft:
        read_config_dict(o.draft)  # a missing or broken config is named before the build
        target = target_for_draft(o.draft, o.target) or o.target
    build = ensure_llamacpp(progress)
    tgt = target_gguf(target, outtype=o.gguf_target, build=build, progress=progress)
    ngram = (o.ngram,) if o.ngram else ()
    if o.no_draft:
        return LlamaPlan(tgt, spec_types=ngram, k=o.k if ngram else None)
    exported = export_draft(o.draft, target=target, outtype=o.gguf_draft, build=build, progress=progress)
    return LlamaPlan(tgt, exported.path, (exported.spec_type, *ngram), k=o.k or exported.k, p_min=o.p_min,
                     draft=str(exported.draft))


def _serve_here(o: ServeOptions, plan: LlamaPlan, *, as_json: bool) -> int:
    rep = reporter()
    server = LlamaServer(plan, host=o.host, port=pick_port(o), threads=o.threads, ctx=o.max_model_len)
    print(f"equivalent: {server.command_line()}")
    try:
        server.start()
        rep.phase(START_PHASE, span=(0.5, 1.0))  # filled by what the last start here took (Reporter.beat)
        rep.update(f"starting llama-server on {server.url}", **server.describe())
        server.wait_ready(timeout=o.timeout, progress=rep.beat)
        info = {**server.describe(), "ready": True, "ready_after_s": round(server.ready_after_s or 0, 1)}
        rep.phase("serving")
        rep.update(f"serving on {server.url}", progress=1.0, **info)
        print(json.dumps(info) if as_json else f"llama.cpp is serving on {server.url} (log: {server.log_path}); "
              "Ctrl-C stops it", flush=True)
        while server.running():
            time.sleep(1.0)
        raise server.failure(f"llama-server exited with code {server.proc.returncode}")
    except KeyboardInterrupt:
        rep.update(f"stopped llama-server on {server.url}", ready=False)
        raise
    finally:
        server.stop()
