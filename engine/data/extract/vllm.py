"""Extraction through vLLM's `extract_hidden_states` speculative method and a hidden-states connector."""

# This is the path for large targets and many GPUs (vLLM shards the target with tensor parallelism): each row is
# a 1-token generation request; the connector saves the prompt's hidden states at the requested layer ids as
# `{req_id}.safetensors` (hidden_states [T, L, H], token_ids [T]) in a staging folder, and we verify each file,
# add the loss mask and store it as `hs_{i}.safetensors` through the same `ExtractionRun` as the transformers
# backend. vLLM runs in this process when it imports here with a CUDA GPU; otherwise in its own environment
# (`engine.serve.venv`, the CPU build on a CPU machine) as a worker process (`vllm_side/workbench_hs_worker.py`),
# where a CPU build writes through that file's `CpuHiddenStatesConnector` (vLLM's own connector needs CUDA streams).

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.data.extract.run import ExtractionProgress, ExtractionRun, TargetInfo, build_header, log_done
from engine.data.options import ExtractOptions
from engine.data.render.chat import RenderedRow
from engine.errors import WorkbenchError
from engine.format.validate import VLLM_CPU_HEAD_SIZES, head_size
from engine.format.vllm_rules import NO_AUX_STATES_MESSAGE, verifier_without_aux_states
from engine.fsutil import workbench_home
from engine.serve.server import vllm_failure, vllm_process_env
from engine.targets.dtypes import vllm_dtype

log = logging.getLogger(__name__)

CONNECTOR = "ExampleHiddenStatesConnector"
DEFAULT_CHUNK = 256  # requests handed to LLM.generate at once (vLLM schedules within a chunk)


WORKER = Path(__file__).resolve().parent / "vllm_side" / "workbench_hs_worker.py"
CPU_CONNECTOR = "CpuHiddenStatesConnector"  # defined in WORKER, loaded by vLLM through kv_connector_module_path
WORKER_REPLY = "WORKBENCH-HS "  # the worker's protocol lines on its stdout (WORKER.REPLY_PREFIX)


def _in_process_reason() -> str | None:
    """None when vLLM imports in this environment and a CUDA GPU is present; else why it cannot run here."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (vLLM's hidden-states connector needs CUDA)"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
        return f"vLLM failed to import: {type(exc).__name__}: {exc}"
    return None


def vllm_unavailable_reason() -> str | None:
    """None when vLLM can extract here: in this process (vLLM and a CUDA GPU), or in vLLM's own environment."""
    from engine.serve.venv import read_stamp, vllm_venv_dir

    here = _in_process_reason()
    if here is None or read_stamp() is not None:
        return None
    return f"{here}, and vLLM's own environment is not installed at {vllm_venv_dir()}"


def require_vllm() -> None:
    reason = vllm_unavailable_reason()
    if reason:
        raise WorkbenchError(f"the vllm extraction backend cannot run: {reason}",
                             hint="`make vllm-env` installs vLLM's own environment (the CPU build on a machine "
                                  "without a GPU; `python -m engine serve` installs it on first use too), or use "
                                  "--backend transformers")


def refuse_unsupported_target(target_config: dict, target: str) -> None:
    """Refuse, before vLLM starts, a target vLLM would stop on: a model class that gives no aux hidden states, or on
    vLLM's CPU build an attention head size it has no kernel for."""
    from engine.serve.venv import read_stamp

    hint = "use --backend transformers, which extracts from any target"
    arch = verifier_without_aux_states(target_config)
    if arch is not None:
        raise WorkbenchError(f"vLLM cannot extract hidden states from {target}: its {arch} class gives no aux hidden "
                             f"states (vLLM stops at load with a RuntimeError ending '{NO_AUX_STATES_MESSAGE}')",
                             hint=hint)
    env = read_stamp() if _in_process_reason() is not None else None
    head = head_size(target_config)
    if env is not None and env.flavor == "cpu" and isinstance(head, int) and head not in VLLM_CPU_HEAD_SIZES:
        raise WorkbenchError(f"vLLM's CPU build cannot extract hidden states from {target}: its attention head size "
                             f"is {head}, and the CPU build runs only {list(VLLM_CPU_HEAD_SIZES)}", hint=hint)


def speculative_config(layer_ids: Sequence[int]) -> dict:
    """The `extract_hidden_states` method: one 'speculative' token, layer ids in the draft hf_config."""
    ids = sorted(set(int(i) for i in layer_ids))
    if not ids:
        raise WorkbenchError("no layer ids to extract", hint="give --layers or --algo")
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}


def kv_transfer_config(storage_path: str | Path, *, cpu: bool = False) -> dict:
    """The connector that writes each request's hidden states under `storage_path` (a producer); with `cpu`, the
    worker's CPU connector in place of vLLM's CUDA one (same files)."""
    config = {"kv_connector": CPU_CONNECTOR if cpu else CONNECTOR, "kv_role": "kv_producer",
              "kv_connector_extra_config": {"shared_storage_path": str(storage_path)}}
    if cpu:
        config["kv_connector_module_path"] = WORKER.stem
    return config


def llm_kwargs(model: str, layer_ids: Sequence[int], storage_path: str | Path, *, tensor_parallel_size: int = 1,
               dtype: str = "bfloat16", max_model_len: int | None = None, seed: int = 0, cpu: bool = False,
               **extra: Any) -> dict:
    """Keyword arguments for `vllm.LLM(...)` (kv_transfer_config as a dict; `make_llm` wraps it).

    Chunked prefill must be off (vLLM docs: incompatible with this method); prefix caching is off so that every
    prompt token's states are computed for its own request.
    """
    kwargs = {"model": model, "tensor_parallel_size": int(tensor_parallel_size), "dtype": dtype, "seed": seed,
              "speculative_config": speculative_config(layer_ids),
              "kv_transfer_config": kv_transfer_config(storage_path, cpu=cpu),
              "enable_chunked_prefill": False, "enable_prefix_caching": False}
    if max_model_len is not None:
        kwargs["max_model_len"] = int(max_model_len)
    kwargs.update(extra)
    return kwargs


def sampling_kwargs() -> dict:
    """`SamplingParams` for extraction: generate one token greedily; the prompt's states are what we keep."""
    return {"max_tokens": 1, "temperature": 0.0}


def prompts_for(rows: Sequence[RenderedRow]) -> list[dict]:
    """vLLM TokensPrompt dicts: the exact token ids we rendered (no re-tokenisation on the vLLM side)."""
    return [{"prompt_token_ids": list(row.input_ids)} for row in rows]


def output_path(output: Any) -> Path:
    """Where the connector wrote a request's hidden states (`RequestOutput.kv_transfer_params`)."""
    params = getattr(output, "kv_transfer_params", None) or {}
    path = params.get("hidden_states_path")
    if not path:
        raise WorkbenchError("vLLM returned no hidden_states_path for a request",
                             hint=f"check that kv_transfer_config uses {CONNECTOR} with kv_role kv_producer")
    return Path(path)


def read_connector_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a connector file, holding a shared lock on `<path>.lock` (the writer holds it exclusively)."""
    from safetensors.torch import load_file

    path = Path(path)
    lock = Path(f"{path}.lock")
    with contextlib.ExitStack() as stack:
        if lock.exists():
            fd = os.open(lock, os.O_RDONLY)
            stack.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_SH)
        data = load_file(str(path), device="cpu")
    if "hidden_states" not in data or "token_ids" not in data:
        raise WorkbenchError(f"{path} is not a hidden-states file (keys {sorted(data)})",
                             hint="is the connector ExampleHiddenStatesConnector?")
    return data


def collect(run: ExtractionRun, index: int, path: str | Path) -> None:
    """Verify a connector file against row `index`, store it as hs_{index} with its loss mask, delete the original."""
    data = read_connector_file(path)
    run.write(index, data["hidden_states"], token_ids=data["token_ids"].tolist())
    Path(path).unlink(missing_ok=True)
    Path(f"{path}.lock").unlink(missing_ok=True)


def make_llm(kwargs: dict):
    """Construct `vllm.LLM` from `llm_kwargs` (imports vLLM; the only place that does)."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs = dict(kwargs, kv_transfer_config=KVTransferConfig(**kwargs["kv_transfer_config"]))
    return LLM(**kwargs)


def staging_dir(out: Path) -> Path:
    """A RAM-backed folder for the connector's files when /dev/shm exists (vLLM's advice), else one under out."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else out
    return Path(tempfile.mkdtemp(prefix=".workbench-hs-", dir=base))


class VllmWorker:
    """vLLM in its own environment: the worker script, given chunks of token ids on stdin, answers the files it
    wrote. Its own output (vLLM's logs) goes to `log_path`."""

    def __init__(self, env, job: dict, log_path: Path):
        import subprocess

        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        job_file = self.log_path.with_suffix(".job.json")
        job_file.write_text(json.dumps(job))

        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(env.python), str(WORKER), str(job_file)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True,
                                     env={**vllm_process_env(env), "PYTHONPATH": str(WORKER.parent)})
        self._reply()  # {"ready": true} once the model is loaded

    def _reply(self) -> dict:
        """The worker's next protocol line; its other stdout lines (vLLM's log) go to the log file."""
        for line in self.proc.stdout:
            if line.startswith(WORKER_REPLY):
                return json.loads(line[len(WORKER_REPLY):])
            self._log.write(line)
        self._log.flush()
        raise self._failure()

    def _failure(self) -> WorkbenchError:
        self.proc.wait(timeout=60)
        return vllm_failure(f"vLLM's extraction worker stopped (exit code {self.proc.returncode})", self.log_path,
                            hint="fix what vLLM reports above, or use --backend transformers", last_lines=15)

    def paths(self, token_ids: Sequence[Sequence[int]]) -> list[Path]:
        """Extract one chunk of prompts; the connector's file of each, in order."""
        try:
            self.proc.stdin.write(json.dumps([list(map(int, ids)) for ids in token_ids]) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._failure() from None
        paths = self._reply()["paths"]
        if len(paths) != len(token_ids) or not all(paths):
            raise WorkbenchError("vLLM returned no hidden_states_path for a request",
                                 hint=f"look at {self.log_path}")
        return [Path(p) for p in paths]

    def close(self) -> None:
        import signal

        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write("\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except Exception:  # noqa: BLE001 - any failure to stop politely ends in a kill
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()


def _worker_log() -> Path:
    return workbench_home() / "vllm-extract" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextlib.contextmanager
def vllm_files(model: str, layer_ids: Sequence[int], storage: Path, *, dtype: str, tensor_parallel_size: int = 1,
               llm: Any = None, llm_extra: dict | None = None) -> Iterator[Callable[[list[list[int]]], list[Path]]]:
    """A function from prompts (token-id lists) to the connector's files: vLLM in this process (`llm`, or built
    when vLLM and a CUDA GPU are here), else the worker in vLLM's own environment."""
    kwargs = dict(tensor_parallel_size=tensor_parallel_size, dtype=vllm_dtype(dtype), **(llm_extra or {}))
    if llm is None and _in_process_reason() is not None:
        from engine.serve.venv import read_stamp

        env = read_stamp()
        if env is None:
            require_vllm()
        cpu = {"cpu": True, "enforce_eager": True} if env.flavor == "cpu" else {}  # as the CPU server runs
        job = {"llm": llm_kwargs(model, layer_ids, storage, **cpu, **kwargs),
               "sampling": sampling_kwargs()}
        log_path = _worker_log()
        log.info("starting vLLM (%s build) in %s; its log: %s", env.flavor, env.path, log_path)
        worker = VllmWorker(env, job, log_path)
        try:
            yield worker.paths
        finally:
            worker.close()
        return
    if llm is None:
        llm = make_llm(llm_kwargs(model, layer_ids, storage, **kwargs))
    from vllm import SamplingParams

    params = SamplingParams(**sampling_kwargs())
    yield lambda ids: [output_path(o) for o in llm.generate([{"prompt_token_ids": list(i)} for i in ids], params,
                                                            use_tqdm=False)]


def extract_rows_vllm(info: TargetInfo, rows: Sequence[RenderedRow], options: ExtractOptions,
                      layer_ids: Sequence[int], *, header_extra: dict | None = None, chunk: int = DEFAULT_CHUNK,
                      progress: bool = True, llm: Any = None) -> dict:
    """Extract rendered rows of the target at `info.path` with vLLM into `options.out` (same files and manifest
    as the transformers backend; `options.dtype`, `overwrite`, `tensor_parallel_size` as there).

    `llm` may be given (an object with vLLM's `generate(prompts, sampling_params, use_tqdm=...)`), else vLLM runs
    here or in its own environment (`vllm_files`), its context as long as the longest row.
    """
    out, dtype, model = Path(options.out), options.dtype, info.path
    llm_extra = {"max_model_len": max((r.num_tokens for r in rows), default=1) + 1}
    layer_ids = sorted(set(int(i) for i in layer_ids))
    header = build_header(info, layer_ids, dtype, backend="vllm", source=header_extra)
    with ExtractionRun(out, header, rows, overwrite=options.overwrite) as run:
        todo = run.pending
        if not todo:
            return run.manifest
        storage = staging_dir(out)
        try:
            with vllm_files(model, layer_ids, storage, dtype=header["dtype"], llm=llm, llm_extra=llm_extra,
                            tensor_parallel_size=options.tensor_parallel_size) as files, \
                    ExtractionProgress(run, sum(rows[i].num_tokens for i in todo), progress) as bar:
                for start in range(0, len(todo), chunk):
                    indices = todo[start: start + chunk]
                    for i, path in zip(indices, files([list(rows[i].input_ids) for i in indices]), strict=True):
                        collect(run, i, path)
                        bar.advance(rows[i].num_tokens)
        finally:
            shutil.rmtree(storage, ignore_errors=True)
    log_done(run)
    return run.manifest
