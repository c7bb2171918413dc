"""Glue for the Benchmarks page: the bench command line and the result files of finished bench jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from engine import jobs as engine_jobs

METHODS = ("baseline", "draft", "ngram", "hf_prompt_lookup", "hf_assisted")


def bench_argv(*, target: str, draft: str | None, prompts: str, num_prompts: int, max_new_tokens: int, k: int,
               temperature: float, methods: list[str], backend: str, json_out: str) -> list[str]:
    argv = ["bench", "--target", target, "--prompts", prompts, "--num-prompts", str(num_prompts),
            "--max-new-tokens", str(max_new_tokens), "--k", str(k), "--temperature", str(temperature),
            "--methods", ",".join(methods), "--backend", backend, "--json", json_out]
    if draft and "draft" in methods:
        argv[3:3] = ["--draft", draft]
    return argv


def new_json_path() -> str:
    return str(engine_jobs.runs_dir() / "bench" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json")


def result_path(job: engine_jobs.Job) -> Path | None:
    from ui.jobs import argv_value

    path = job.status.result.get("json") or argv_value(job, "--json")
    return Path(path) if path else None


def results() -> dict[str, Path]:
    """Finished bench jobs whose JSON exists, newest first, plus loose files under runs/bench/."""
    out: dict[str, Path] = {}
    for job in engine_jobs.list_jobs():
        if job.kind == "bench":
            p = result_path(job)
            if p is not None and p.is_file():
                out[f"{job.id}"] = p
    loose = engine_jobs.runs_dir() / "bench"
    if loose.is_dir():
        for p in sorted(loose.glob("*.json"), reverse=True):
            if p not in out.values():
                out[p.name] = p
    return out


def load(path: str | Path) -> dict[str, Any]:
    from engine.errors import WorkbenchError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"cannot read {path}: {exc}", hint="choose a JSON written by `bench --json`") from exc
    return check(data)


def check(data: Any) -> dict[str, Any]:
    from engine.errors import WorkbenchError

    if not isinstance(data, dict) or not isinstance(data.get("methods"), dict):
        raise WorkbenchError("this JSON has no 'methods' object", hint="use a file written by `python -m engine bench "
                             "--json FILE`")
    return data


def table(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, r in result["methods"].items():
        if r.get("skipped"):
            rows.append({"method": name, "skipped": r["skipped"]})
            continue
        rows.append({"method": name, "mean acceptance length": r.get("mean_acceptance_length"),
                     "tokens/s": r.get("tokens_per_s"), "speedup": r.get("speedup"),
                     "speedup ceiling": r.get("speedup_ceiling"),
                     "identical to baseline": r.get("identical_to_baseline"),
                     "acceptance rate": r.get("acceptance_rate")})
    return rows
