"""The device and dtype a target decodes in: parsing the dtype flags, and what `auto` means on this machine."""

from __future__ import annotations

import torch

from engine.cpu import native_bf16
from engine.errors import WorkbenchError


def pick_device(device: str | None = None) -> str:
    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise WorkbenchError(f"unknown dtype '{name}'", hint="use one of bf16, fp16, fp32") from None


# The target dtypes decoding commands take (generate, evaluate, bench), both spellings: bf16/bfloat16, fp32/float32.
DECODE_DTYPES = ("auto", "fastest", *(n for n, d in _DTYPES.items() if d in (torch.bfloat16, torch.float32)))
DECODE_DTYPE_HELP = ("kernel path of the target for in-process decoding: auto = the fastest exact (bit-identical to "
                     "the baseline) path measured on this CPU at the first load of the target, or the fastest path "
                     "when none is exact here; fastest = the fastest measured path, exact or not (lossless in "
                     "distribution as in vLLM; outputs say which); bf16 is a candidate only with native bf16 "
                     "(AVX-512 BF16 / AMX / Arm BF16); bf16/fp32 force one (engine.generate.kernel_choice)")
MEASURED_DECODE = ("auto", "fastest")  # decided by measuring the kernel paths on this CPU


def decode_dtype(choice: str | torch.dtype = "auto", device: str | None = None) -> torch.dtype:
    """The target dtype `auto` means without measuring: bf16 on a CPU that runs it natively (where the routed kernels
    keep speculation exact), fp32 elsewhere (GPU fused kernels are not row-invariant in bf16). Decoding itself
    measures which is faster and exact (engine.generate.kernel_choice.load_decode_target)."""
    if not (isinstance(choice, str) and choice in MEASURED_DECODE):
        return parse_dtype(choice)
    if pick_device(device) != "cpu":
        return torch.float32
    # the CPU's flags: oneDNN also "supports" bf16 where it only emulates it
    return torch.bfloat16 if native_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def vllm_dtype(choice: str | torch.dtype = "auto") -> str:
    """vLLM's `--dtype` spelling of a decoding dtype choice; `auto` serves bf16 (vLLM's CPU default)."""
    if isinstance(choice, str) and choice in MEASURED_DECODE:
        return "bfloat16"
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[parse_dtype(choice)]


# ---------------------------------------------------------------------------------------------------
# Hidden-state capture with vLLM/speculators semantics
# ---------------------------------------------------------------------------------------------------
