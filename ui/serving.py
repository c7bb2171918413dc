"""Glue for the Serve page: the serve command lines (vLLM, llama.cpp), the servers running as jobs, chat, /metrics."""

from __future__ import annotations

from typing import Any

from engine import jobs as engine_jobs
from engine.format.config import CONFIG_TYPES, config_type
from engine.serve.client import VllmClient
from engine.serve.metrics import SpecSnapshot, scrape, spec_delta
from engine.serve.options import ServeOptions, default_dtype
from engine.serve.server import free_port as engine_free_port
from engine.serve.venv import gpu_available
from ui.forms import validation_errors


def serve_argv(values: dict[str, Any]) -> list[str]:
    """The `serve` command of the form's values (ServeOptions fields; the draft's own settings dropped without a
    draft); a value ServeOptions refuses raises ValueError with its reason."""
    given = {name: value for name, value in values.items() if value not in (None, "")}
    if not given.get("draft"):
        given = {name: value for name, value in given.items() if name not in DRAFT_SETTINGS} | {"no_draft": True}
    if given.get("per_request_spec_decode_metrics") == "none":
        given.pop("per_request_spec_decode_metrics")
    options, errors = validation_errors(ServeOptions, given)
    if options is None:
        raise ValueError("; ".join(m for found in errors.values() for m in found))
    return options.argv("serve")


DRAFT_SETTINGS = ("draft", "k", "form", "speculative_fields", "per_request_spec_decode_metrics")  # need a draft
DTYPES = ["bfloat16", "float32", "float16"]  # the dtype field's choices (its default: engine.serve.options)


def vllm_flavor(env) -> str:
    """The vLLM build this machine serves with: the installed one's (`env`), else the one the install would pick."""
    return env.flavor if env is not None else "cuda" if gpu_available() else "cpu"


def dtype_index(flavor: str) -> int:
    """The dtype field's default (engine.serve.options.default_dtype) as an index into DTYPES."""
    return DTYPES.index(default_dtype(flavor))


def dtype_note(dtype: str, flavor: str) -> str:
    """One line on what bf16 costs on a CPU that emulates it, and why the answers may differ; "" elsewhere."""
    from engine.cpu import native_bf16

    if flavor == "cuda" or native_bf16() or dtype not in ("bfloat16", "float32"):
        return ""
    if dtype == "bfloat16":
        return ("This CPU has no native bf16: bfloat16 is emulated here, slower than float32, and its answers may "
                "leave the in-process fp32 ones after a few dozen tokens.")
    return ("float32 by default: this CPU has no native bf16, so bfloat16 would be emulated (slower) and its answers "
            "may differ from the in-process fp32 ones.")


def llamacpp_argv(*, draft: str | None, k: int | None, port: int, ctx: int, gguf_target: str, gguf_draft: str,
                  p_min: float | None, ngram: str | None) -> list[str]:
    """The `serve --engine llama.cpp` command line of the form's values (ValueError with ServeOptions' reason)."""
    given = {"engine": "llama.cpp", "port": port, "max_model_len": ctx, "gguf_target": gguf_target,
             "draft": draft or None, "no_draft": not draft or None, "k": (k or None) if draft or ngram else None,
             "gguf_draft": gguf_draft if draft else None, "p_min": (p_min or None) if draft else None,
             "ngram": ngram or None}
    options, errors = validation_errors(ServeOptions, {name: v for name, v in given.items() if v is not None})
    if options is None:
        raise ValueError("; ".join(m for found in errors.values() for m in found))
    return options.argv("serve")


def llamacpp_types() -> list[str]:
    """The registered draft types llama.cpp runs."""
    import engine.algos  # noqa: F401  (registers the draft types)

    return [n for n in CONFIG_TYPES.names() if config_type(n).llamacpp_spec_type]


def llamacpp_build():
    """This CPU's finished llama.cpp build (engine.llamacpp.build.LlamaCpp) or None."""
    from engine.llamacpp.build import read_stamp

    return read_stamp()


def forms(draft: str | None) -> list[str]:
    """The Form field's choices for a draft, its default first: explicit alone for a draft vLLM reaches only in its
    own form (its draft type says so), else auto then explicit."""
    if draft:
        import engine.algos  # noqa: F401  (registers the draft types whose rules say it)
        from engine.errors import WorkbenchError
        from engine.format.checkpoint import read_config_dict
        from engine.format.config import vllm_own_form

        try:
            if vllm_own_form(read_config_dict(draft)):
                return ["explicit"]
        except WorkbenchError:  # an unreadable draft: the page's validation says why
            pass
    return ["auto", "explicit"]


def option_help(name: str) -> str:
    """A serve option's description (the CLI's help), for the form's field."""
    return ServeOptions.model_fields[name].description or ""


def vllm_env():
    """The installed vLLM environment (engine.serve.venv.VllmEnv) or None."""
    from engine.serve.venv import read_stamp

    return read_stamp()


def free_port() -> int:
    return engine_free_port(8000)


def servers() -> list[engine_jobs.Job]:
    """Serve jobs, running ones first (install-only jobs excluded)."""
    jobs = [j for j in engine_jobs.list_jobs() if j.kind == "serve" and "--install-only" not in j.argv]
    return sorted(jobs, key=lambda j: not j.running)


def server_info(job: engine_jobs.Job) -> dict[str, Any]:
    """The server's status.json facts, plus `full_command`: the exact process command from the top of vllm.log."""
    info = dict(job.status.result or {})
    log = info.get("log")
    if log:
        try:
            with open(log, encoding="utf-8", errors="replace") as f:
                first = f.readline().strip()
            if first.startswith("$ "):
                info["full_command"] = first[2:]
        except OSError:
            pass
    return info


def chat(url: str, messages: list[dict[str, str]], *, max_tokens: int, temperature: float):
    return VllmClient(url, timeout=300).chat(messages, max_tokens=max_tokens, temperature=temperature,
                                            return_token_ids=False)


def acceptance(url: str) -> dict[str, Any] | None:
    """Cumulative spec-decode acceptance since the server started (None when it runs without a draft)."""
    snap = scrape(url, timeout=5)
    if not snap.present:
        return None
    return spec_delta(SpecSnapshot(), snap)
