"""Runs inside vLLM's own environment: extracts hidden states with vLLM's `extract_hidden_states` method on a CPU."""

# vLLM's ExampleHiddenStatesConnector copies each request's states off the GPU on a CUDA stream into pinned memory,
# which a CPU build cannot do. `CpuHiddenStatesConnector` below keeps everything else of it (scheduling, slots,
# lock files, file layout) and writes each finished request's states synchronously from the CPU KV cache; vLLM loads
# it through `kv_connector_module_path`, vLLM's supported way in for a connector it does not ship.
#
# This file imports only vLLM, torch, safetensors and the standard library: the workbench runs it with the vLLM
# environment's python (`python workbench_hs_worker.py JOB.json`); on a CUDA build the job names vLLM's own connector.
# Protocol: the job file holds the `vllm.LLM` keyword arguments ("llm") and the `SamplingParams` ones ("sampling");
# `{"ready": true}` comes once the model is loaded; then each stdin line is a JSON list of token-id lists (one chunk
# of prompts), answered by `{"paths": [...]}` (each prompt's safetensors file, in order); an empty line ends the
# worker. Replies are stdout lines starting with REPLY_PREFIX; vLLM's own output is everything else.

from __future__ import annotations

import fcntl
import json
import os
import sys

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)

REPLY_PREFIX = "WORKBENCH-HS "  # stdout lines the workbench reads; vLLM's own output is left alone


class _Done:
    """Stands for the base class's CUDA event of a copy: on a CPU the write has finished when it is recorded."""

    @staticmethod
    def query() -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector whose per-request write runs on the CPU, without streams or pinned memory."""

    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()  # [blocks * block_size]
        num_tokens = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots, num_tokens).clone()  # [T, L, H]
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file({"hidden_states": states, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()


def _reply(message: dict) -> None:
    sys.stdout.write(REPLY_PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def main(job_file: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    with open(job_file) as fh:
        job = json.load(fh)
    kwargs = dict(job["llm"], kv_transfer_config=KVTransferConfig(**job["llm"]["kv_transfer_config"]))
    llm = LLM(**kwargs)
    params = SamplingParams(**job["sampling"])
    _reply({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            break
        prompts = [{"prompt_token_ids": ids} for ids in json.loads(line)]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        _reply({"paths": [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outputs]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
