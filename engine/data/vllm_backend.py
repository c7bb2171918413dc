"""Extraction through vLLM's `extract_hidden_states` speculative method and its ExampleHiddenStatesConnector.

This is the path for large targets and many GPUs (vLLM shards the target with tensor parallelism): each row is
a 1-token generation request; the connector saves the prompt's hidden states at the requested layer ids as
`{req_id}.safetensors` (hidden_states [T, L, H], token_ids [T]) in a staging folder, and we verify each file,
add the loss mask and store it as `hs_{i}.safetensors` through the same `ExtractionRun` as the transformers
backend. It needs CUDA (the connector uses CUDA streams); the request/config builders below are pure functions.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

from engine.data.extraction_run import ExtractionProgress, ExtractionRun, TargetInfo, build_header, log_done
from engine.data.render import RenderedRow
from engine.errors import WorkbenchError

log = logging.getLogger(__name__)

CONNECTOR = "ExampleHiddenStatesConnector"
DEFAULT_CHUNK = 256  # requests handed to LLM.generate at once (vLLM schedules within a chunk)


def vllm_unavailable_reason() -> str | None:
    """None when vLLM imports and a CUDA GPU is present; else why the vLLM backend cannot run here."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (vLLM's hidden-states connector needs CUDA)"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
        return f"vLLM failed to import: {type(exc).__name__}: {exc}"
    return None


def require_vllm() -> None:
    reason = vllm_unavailable_reason()
    if reason:
        raise WorkbenchError(f"the vllm extraction backend cannot run: {reason}",
                             hint="use --backend transformers (CPU or one GPU), or run on a CUDA machine with vLLM")


def speculative_config(layer_ids: Sequence[int]) -> dict:
    """The `extract_hidden_states` method: one 'speculative' token, layer ids in the draft hf_config."""
    ids = sorted(set(int(i) for i in layer_ids))
    if not ids:
        raise WorkbenchError("no layer ids to extract", hint="give --layers or --algo")
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}}


def kv_transfer_config(storage_path: str | Path) -> dict:
    """The connector that writes each request's hidden states under `storage_path` (a producer)."""
    return {"kv_connector": CONNECTOR, "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(storage_path)}}


def llm_kwargs(model: str, layer_ids: Sequence[int], storage_path: str | Path, *, tensor_parallel_size: int = 1,
               dtype: str = "bfloat16", max_model_len: int | None = None, seed: int = 0, **extra: Any) -> dict:
    """Keyword arguments for `vllm.LLM(...)` (kv_transfer_config as a dict; `make_llm` wraps it).

    Chunked prefill must be off (vLLM docs: incompatible with this method); prefix caching is off so that every
    prompt token's states are computed for its own request.
    """
    kwargs = {"model": model, "tensor_parallel_size": int(tensor_parallel_size), "dtype": dtype, "seed": seed,
              "speculative_config": speculative_config(layer_ids),
              "kv_transfer_config": kv_transfer_config(storage_path),
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


def extract_rows_vllm(model: str, info: TargetInfo, rows: Sequence[RenderedRow], out: str | Path,
                      layer_ids: Sequence[int], *, dtype: str = "bf16", header_extra: dict | None = None,
                      overwrite: bool = False, tensor_parallel_size: int = 1, chunk: int = DEFAULT_CHUNK,
                      progress: bool = True, llm: Any = None, llm_extra: dict | None = None) -> dict:
    """Extract rendered rows with vLLM into `out` (same files and manifest as the transformers backend).

    `llm` may be given (an object with vLLM's `generate(prompts, sampling_params, use_tqdm=...)`), else one is built.
    """
    out = Path(out)
    layer_ids = sorted(set(int(i) for i in layer_ids))
    header = build_header(info, layer_ids, dtype, backend="vllm", **(header_extra or {}))
    with ExtractionRun(out, header, rows, overwrite=overwrite) as run:
        todo = run.pending
        if not todo:
            return run.manifest
        storage = staging_dir(out)
        try:
            if llm is None:
                require_vllm()
                model_dtype = "float16" if header["dtype"] == "fp16" else "bfloat16"
                llm = make_llm(llm_kwargs(model, layer_ids, storage, tensor_parallel_size=tensor_parallel_size,
                                          dtype=model_dtype, **(llm_extra or {})))
            from vllm import SamplingParams

            params = SamplingParams(**sampling_kwargs())
            with ExtractionProgress(run, sum(rows[i].num_tokens for i in todo), progress) as bar:
                for start in range(0, len(todo), chunk):
                    indices = todo[start: start + chunk]
                    outputs = llm.generate(prompts_for([rows[i] for i in indices]), params, use_tqdm=False)
                    for i, output in zip(indices, outputs):
                        collect(run, i, output_path(output))
                        bar.advance(rows[i].num_tokens)
        finally:
            shutil.rmtree(storage, ignore_errors=True)
    log_done(run)
    return run.manifest
