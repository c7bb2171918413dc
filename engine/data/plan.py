"""What a target is (its family and what of it a draft sees) and what an extraction and a training run for it will
need on this machine (disk and memory), from its config alone, before anything starts."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.data.extract.dataset import DEFAULT_BATCH_TOKENS
from engine.data.extract.run import estimate_bytes
from engine.errors import WorkbenchError
from engine.format.vllm_rules import (
    cpu_build_refusal,
    registry_gives_aux_states,
    verifier_architecture,
    verifier_without_aux_states,
)
from engine.targets.dtypes import parse_dtype
from engine.targets.resolve import cached_snapshot, resolve_target
from engine.targets.verifier import VerifierParts
from engine.weightfiles import weight_files

# model_type -> (family, what of it changes what a draft sees). The families a tiny random checkpoint of runs end to
# end with every registered algorithm in tests/engine/test_families.py (which checks this table lists them all).
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("Llama", "plain RMSNorm and embedding"),
    "qwen2": ("Qwen2 / Qwen2.5", "plain RMSNorm and embedding; q/k/v biases"),
    "qwen3": ("Qwen3", "plain RMSNorm and embedding; q/k norms"),
    "qwen3_moe": ("Qwen3-MoE", "MoE router inside the target only: the draft reads the residual stream"),
    "mistral": ("Mistral", "sliding-window attention in the target (the KV cache rolls back past the window)"),
    "gemma2": ("Gemma 2", "embedding scaled by sqrt(H) inside the target (the draft gets the plain embedding, as "
                          "vLLM shares it); final norm x*(1+w); final logit soft-capping; sliding-window layers"),
    "gemma3_text": ("Gemma 3 (text)", "embedding scaled by sqrt(H) inside the target (the draft gets the plain "
                                      "embedding); final norm x*(1+w); local and global RoPE (the draft takes the "
                                      "global one); sliding-window layers"),
    "phi3": ("Phi-3 / Phi-4", "fused qkv and gate_up projections; plain RMSNorm"),
    "olmo2": ("OLMo-2", "norms after attention and MLP; q/k norms; plain final RMSNorm"),
    "granite": ("Granite", "embedding, residual and attention multipliers inside the target; logits divided by "
                           "logits_scaling (greedy argmax unchanged)"),
    "gpt_oss": ("gpt-oss", "MoE router and attention sinks inside the target; sliding-window layers (128)"),
    "gemma4_text": ("Gemma 4 (dense or MoE)", "embedding scaled inside the target (the draft gets the plain one, or "
                                              "scales its own copy in vLLM's Gemma 4 draft layout); sliding and "
                                              "global layers, the global ones with their own head size"),
    "glm4_moe": ("GLM-4 MoE", "MoE router inside the target only; vLLM's class gives no aux hidden states"),
    "seed_oss": ("Seed-OSS", "plain RMSNorm and embedding; q/k/v biases"),
    "llama4_text": ("Llama 4 (text)", "MoE router and chunked attention inside the target; the draft reads the "
                                      "residual stream"),
    "qwen3_next": ("Qwen3-Next", "Gated DeltaNet (linear-attention) layers: their recurrent state is rewound and the "
                                 "kept tokens run again after a rejection (slower steps, same output)"),
    "qwen3_5_text": ("Qwen3.5", "Gated DeltaNet layers between full attention ones (rewound as Qwen3-Next's)"),
    "qwen3_5_moe_text": ("Qwen3.5 MoE", "Gated DeltaNet layers (rewound as Qwen3-Next's); MoE router"),
    "deepseek_v3": ("DeepSeek-V3", "MLA attention (compressed KV); speculation refused where the KV heads are fewer "
                                   "than the heads (transformers' cached multi-token step fails)"),
}

@dataclass
class Need:
    """Bytes one run needs, what is free for it here, and the formula's parts."""

    bytes: int
    available: int | None
    parts: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool | None:
        return None if self.available is None else self.bytes <= self.available


@dataclass
class TargetPlan:
    """A target's family, its layer ids per algorithm, and what an extraction and a training run need here."""

    model_type: str
    family: str
    draft_sees: str
    tested_family: bool
    num_layers: int
    hidden_size: int
    vocab_size: int
    parameters: int
    layer_ids: dict[str, list[int]]  # algorithm -> the ids extraction captures for it (default aux ids + N)
    draft_parameters: dict[str, int | None]  # algorithm -> parameters of its default draft (None: not buildable)
    extraction_disk: dict[str, Need]
    extraction_memory: Need
    training_disk: dict[str, Need]
    training_memory: dict[str, Need]
    vllm_without_aux_states: str | None = None  # the architecture, when vLLM cannot serve drafts beside this target
    architecture: str | None = None  # config.json's first architecture
    # the vLLM CPU build's registry on that class: True gives a draft aux states, False none, None not in it
    vllm_aux_states: bool | None = None
    cpu_build_refusal: str | None = None  # why the vLLM CPU build serves no draft beside it (linear attention, MLA)

    def to_dict(self) -> dict:
        return asdict(self)


def total_memory() -> int | None:
    """Physical memory of this machine in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def free_disk(folder: str | Path) -> int | None:
    """Free bytes on the disk that holds `folder` (its nearest existing parent)."""
    path = Path(folder).expanduser().resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _parameter_count(folder: Path, config) -> int:
    """Parameters from safetensors headers when the files are here, else from the config's shapes."""
    try:
        from safetensors import safe_open

        total = 0
        for f in weight_files(folder):
            with safe_open(str(f), framework="pt") as h:
                total += sum(math.prod(h.get_slice(k).get_shape()) for k in h.keys())
        if total:
            return total
    except (WorkbenchError, OSError):
        pass
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _draft_parameters(ref, config, algo: str, aux_ids: list[int]) -> tuple[int, int] | None:
    """(all, trainable) parameters of the algorithm's default draft for this target, built on the meta device."""
    from torch import nn

    from engine.algos import ALGOS

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    v, h = int(text.vocab_size), int(text.hidden_size)
    algorithm = ALGOS.get(algo)
    try:
        with torch.device("meta"):
            parts = VerifierParts(ref, config, nn.Embedding(v, h), torch.empty(v, h), torch.empty(h), 1e-6)
            draft = algorithm.build(parts, algorithm.args_class(), aux_layer_ids=aux_ids, token_counts=None, seed=0)
    except Exception:  # noqa: BLE001 - an algorithm that cannot build for this target simply has no figure
        return None
    return (sum(p.numel() for p in draft.parameters()),
            sum(p.numel() for p in draft.parameters() if p.requires_grad))


def plan_target(name_or_path: str, *, samples: int = 1000, tokens_per_sample: int = 1024, dtype: str = "bf16",
                out: str | Path = "runs", tokens_per_batch: int = 2048, keep_checkpoints: int = 2,
                batch_tokens: int | None = None) -> TargetPlan:
    """The plan for `samples` conversations of `tokens_per_sample` tokens: hidden states on disk per algorithm, the
    target's memory while extracting (weights in fp32 on CPU + one batch's activations), and per algorithm the draft's
    checkpoints on disk and its training memory (weights, gradients, AdamW state, the verifier's embedding, lm_head and
    one micro-batch's activations). Estimates from formulas (this module), not measurements."""
    from transformers import AutoConfig

    from engine.algos import ALGOS

    ref = resolve_target(name_or_path)
    folder = Path(ref.path) if Path(ref.path).is_dir() else cached_snapshot(ref.path)
    if folder is None:
        raise WorkbenchError(f"target '{name_or_path}' is not available locally",
                             hint="use a local folder, the built-in target, or a hub id already in the HF cache")
    config = AutoConfig.from_pretrained(str(folder))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n, h, v = int(text.num_hidden_layers), int(text.hidden_size), int(text.vocab_size)
    inter = int(getattr(text, "intermediate_size", 4 * h) or 4 * h)
    model_type = str(getattr(text, "model_type", "") or getattr(config, "model_type", "?"))
    family, sees = FAMILIES.get(model_type, (model_type, "not one of the families the tests run end to end"))
    params = _parameter_count(folder, config)
    itemsize = torch.empty((), dtype=parse_dtype(dtype)).element_size()
    tokens = samples * tokens_per_sample
    disk_free, mem_total = free_disk(out), total_memory()

    layer_ids, draft_params, ex_disk, tr_disk, tr_mem = {}, {}, {}, {}, {}
    for algo in ALGOS.names():
        algorithm = ALGOS.get(algo)
        aux = sorted(set(algorithm.default_layer_ids(n)))
        ids = sorted(set(aux) | {n})
        layer_ids[algo] = ids
        ex_disk[algo] = Need(estimate_bytes(tokens, samples, len(ids), h, dtype), disk_free,
                             {"hidden states": tokens * len(ids) * h * itemsize, "token ids and masks": tokens * 16})
        counts = _draft_parameters(ref, config, algo, aux)
        draft_params[algo] = counts[0] if counts else None
        if counts is None:
            continue
        total, trainable = counts
        checkpoint = total * 4 + trainable * 8  # fp32 weights + AdamW's two moments
        tr_disk[algo] = Need(checkpoint * (keep_checkpoints + 1), disk_free,
                             {"one checkpoint": checkpoint, "checkpoints kept (+ final)": keep_checkpoints + 1})
        parts = {"draft weights (fp32)": total * 4, "gradients and AdamW state": trainable * 12,
                 "verifier embedding, lm_head, norm (fp32)": (2 * v * h + h) * 4,
                 # a micro-batch: its hidden states, the draft's activations (~16 H-wide tensors per token, a guess
                 # that covers attention and MLP), and logits over the vocabulary for the loss
                 "one micro-batch": tokens_per_batch * (len(ids) * h * 4 + 16 * h * 4 + 3 * v * 4)}
        tr_mem[algo] = Need(sum(parts.values()), mem_total, parts)
    batch = batch_tokens or DEFAULT_BATCH_TOKENS
    ex_parts = {"target weights (fp32 on CPU)": params * 4,
                "one batch's activations": batch * (4 * h + 2 * inter) * 4 + batch * n * h * itemsize}
    return TargetPlan(model_type, family, sees, model_type in FAMILIES, n, h, v, params, layer_ids, draft_params,
                      ex_disk, Need(sum(ex_parts.values()), mem_total, ex_parts), tr_disk, tr_mem,
                      vllm_without_aux_states=verifier_without_aux_states(config.to_dict()),
                      architecture=verifier_architecture(config.to_dict()),
                      vllm_aux_states=registry_gives_aux_states(config.to_dict()),
                      cpu_build_refusal=cpu_build_refusal(config.to_dict()))


def human_size(n: int | None) -> str:
    """1.5 GiB, for people."""
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n:.1f} TiB"
