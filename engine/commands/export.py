"""`export --to gguf DRAFT`: a draft (and, if asked, its target) as GGUF files for llama.cpp, checked by loading."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.commands.flags import add_model_fields, model_overrides
from engine.errors import WorkbenchError
from engine.jobs import reporter
from engine.llamacpp.build import ensure_llamacpp
from engine.llamacpp.options import ExportOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("draft", help=ExportOptions.model_fields["draft"].description)
    add_model_fields(p, ExportOptions, skip=("draft",), title="export")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.llamacpp.gguf import export_draft, target_gguf
    from engine.llamacpp.server import LlamaPlan, LlamaServer

    o = ExportOptions(**model_overrides(args, ExportOptions))
    rep = reporter()

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)
        rep.update(message, progress=fraction)

    exported = export_draft(o.draft, o.out or o.default_out(), target=o.target, outtype=o.draft_type,
                            progress=progress)  # refuses a type llama.cpp does not run before building anything
    build = ensure_llamacpp(progress)
    target = target_gguf(str(exported.target_dir), outtype=o.target_type, progress=progress, build=build)
    written_target = _copy_target(target, o.target_out) if o.target_out else None
    plan = LlamaPlan(written_target or target, exported.path, (exported.spec_type,), k=exported.k,
                     draft=str(exported.draft))
    info = {"draft_gguf": str(exported.path), "spec_type": exported.spec_type, "k": exported.k,
            "draft_type": o.draft_type, "target_gguf": str(written_target or target),
            "llama_server": LlamaServer(plan).command_line(), "llama_cpp_version": build.version}
    if o.check:
        progress("checking: llama-server loads the target and the draft and drafts a few tokens", 0.9)
        info["check"] = _check(plan, build)
    rep.update("done", 1.0, **info)
    if args.json:
        print(json.dumps(info))
    else:
        print(f"wrote {exported.path} ({exported.spec_type}, k = {exported.k})")
        if written_target:
            print(f"wrote {written_target} (the target, {o.target_type})")
        if "check" in info:
            c = info["check"]
            print(f"checked: llama-server loaded both and drafted {c['draft_n']} tokens, {c['draft_n_accepted']} "
                  f"accepted, in {c['tokens']} generated")
        print(f"serve it: {info['llama_server']}")
    return 0


def _check(plan, build) -> dict:
    """Start llama-server on the files and generate 16 greedy tokens; it must draft."""
    from engine.llamacpp.server import LlamaServer

    with LlamaServer(plan, build=build) as server:
        answer = server.client().complete("Hello! Tell me about the sea.", max_tokens=16)
    if answer.tokens and not answer.draft_n:
        raise WorkbenchError(f"llama-server loaded {plan.draft_gguf} but drafted nothing in {answer.tokens} tokens",
                             hint=f"see {server.log_path}")
    return {"tokens": answer.tokens, "draft_n": answer.draft_n, "draft_n_accepted": answer.draft_accepted,
            "log": str(server.log_path)}


def _copy_target(target: Path, out: str) -> Path:
    from engine.llamacpp.gguf import copy_out

    return copy_out(target, Path(out))
