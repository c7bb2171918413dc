"""Run by vLLM's interpreter (.venv-vllm), never imported: vLLM's own Gemma4DSparkForCausalLM on a draft folder in
vLLM's form and the inputs the test wrote, outputs back as safetensors.

    python -P vllm_gemma4_dspark.py FOLDER INPUTS.safetensors OUTPUTS.safetensors TOKENIZER_FOLDER
"""

# The model is built by vLLM (its config parser, its classes) and loaded through its `load_weights`. Its context
# path is vLLM's own `precompute_and_store_context_kv` (fused K projection, K norm, weightless V norm, RoPE kernel);
# the cache write at its end is captured instead of stored, and its grouped K norm runs layer by layer (see
# `per_layer_k_norm`). The block then runs vLLM's layers. Only the attention
# kernel is replaced, as the CPU build has no runner for DSpark: queries see the captured context rows and their
# own block, bidirectionally where vLLM's `get_draft_attn_causal` says so, at the scale of vLLM's Attention.
# Inputs: aux [T, A*Ht] (target features), ids [T], anchors [n]. Per anchor j, slot k: outputs `logits` [n, B, V]
# = compute_draft_logits + markov_bias(markov_embed(ids[anchor + k])) and `confidence` [n, B] (the head's logit),
# plus `causal` [L] (bool).

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file


def main(folder: str, inputs: str, outputs: str, tokenizer: str) -> None:
    from vllm.config import CompilationConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    draft = ModelConfig(model=folder, tokenizer=tokenizer, dtype="float32")   # vLLM's own config parser
    # Only what the model classes read of the speculative config: the draft's config; no adaptive verification.
    vllm_config = VllmConfig(model_config=draft, compilation_config=CompilationConfig(mode=CompilationMode.NONE))
    vllm_config.speculative_config = SimpleNamespace(draft_model_config=draft, enable_adaptive_verification=False)
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:29533",
                                     local_rank=0, backend="gloo")
        initialize_model_parallel(1)
        save_file(run(draft.hf_config, vllm_config, Path(folder), load_file(inputs)), outputs)


class CapturedContext:
    """Stands where vLLM writes the context K/V into a layer's cache: keeps them for the block's attention."""

    def __init__(self):
        self.kv_cache = None
        self.k = self.v = None
        self.impl = SimpleNamespace(do_kv_cache_update=self.update)

    def update(self, _layer, k, v, _cache, _slots):
        self.k, self.v = k.clone(), v.clone()   # [T, nkv, hd]


class BlockAttention(torch.nn.Module):
    """q/k/v [B, heads*hd] of one block over the captured context rows, at vLLM's Attention's scale."""

    def __init__(self, original, context: CapturedContext, causal: bool):
        super().__init__()
        self.nh, self.nkv, self.hd = original.num_heads, original.num_kv_heads, original.head_size
        self.scale, self.context, self.causal = original.impl.scale, context, causal

    def forward(self, q, k, v):
        b = q.shape[0]
        q = q.view(b, self.nh, self.hd).transpose(0, 1)                               # [nh, B, hd]
        keys = torch.cat([self.context.k, k.view(b, self.nkv, self.hd)]).transpose(0, 1)  # [nkv, T+B, hd]
        values = torch.cat([self.context.v, v.view(b, self.nkv, self.hd)]).transpose(0, 1)
        keys = keys.repeat_interleave(self.nh // self.nkv, 0)
        values = values.repeat_interleave(self.nh // self.nkv, 0)
        scores = q @ keys.transpose(1, 2) * self.scale                               # [nh, B, T+B]
        if self.causal:
            t = self.context.k.shape[0]
            scores[:, :, t:] = scores[:, :, t:].masked_fill(
                torch.ones(b, b, dtype=torch.bool).triu(1), float("-inf"))
        return (scores.softmax(-1) @ values).transpose(0, 1).reshape(b, self.nh * self.hd)


def per_layer_k_norm(backbone) -> None:
    """The CPU build's `ops.rms_norm` applies row 0 of a [L, hd] weight to every layer (its CUDA kernel selects the
    row per layer, the grouped norm `_normalize_context_k` relies on): run the same kernel once per layer instead."""
    from vllm import _custom_ops as ops

    def normalize(all_k: torch.Tensor) -> torch.Tensor:                           # [L, T, nkv, hd]
        out = torch.empty_like(all_k)
        for i in range(all_k.shape[0]):
            ops.rms_norm(out[i], all_k[i].contiguous(), backbone._k_norm_weights[i].contiguous(),
                         backbone._rms_norm_eps)
        return out

    backbone._normalize_context_k = normalize


def run(hf, vllm_config, folder: Path, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from vllm.model_executor.models.gemma4_dspark import Gemma4DSparkForCausalLM

    torch.set_default_dtype(torch.float32)
    model = Gemma4DSparkForCausalLM(vllm_config=vllm_config)
    tensors = load_file(str(folder / "model.safetensors"))
    loaded = model.load_weights(tensors.items())
    missing = {n for n, _ in model.named_parameters()} - loaded
    assert not missing, f"parameters vLLM did not load: {sorted(missing)}"
    for sub in model.modules():  # as vLLM's loader does after load_weights (the CPU linears' packed weights)
        method = getattr(sub, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(sub)
    per_layer_k_norm(model.model)
    causal = model.get_draft_attn_causal()
    contexts = [CapturedContext() for _ in model.model.layers]
    model.model._attn_layers = contexts
    for layer, context, is_causal in zip(model.model.layers, contexts, causal, strict=True):
        layer.self_attn.attn = BlockAttention(layer.self_attn.attn, context, is_causal)
    block, mask = int(hf.block_size), int(hf.mask_token_id)
    ids, aux = x["ids"], x["aux"]
    logits, confidence = [], []
    with torch.no_grad():
        states = model.combine_hidden_states(aux)                                  # [T, H]
        for a in x["anchors"].tolist():
            model.precompute_and_store_context_kv(states[:a], torch.arange(a), torch.zeros(a, dtype=torch.long))
            block_ids = torch.full((block,), mask)
            block_ids[0] = ids[a]
            hidden = model.model(block_ids, torch.arange(a, a + block))              # [B, H], normed
            prev = ids[a:a + block]                                                  # x_{k-1}: the data's tokens
            embed = model.markov_embed(prev)                                        # [B, r]
            logits.append(model.compute_draft_logits(hidden) + model.markov_bias(embed))
            if model.model.confidence_head is not None:
                confidence.append(model.model.confidence_head(hidden, embed))
    out = {"logits": torch.stack(logits), "causal": torch.tensor(causal)}
    if confidence:
        out["confidence"] = torch.stack(confidence)
    return out


if __name__ == "__main__":
    main(*sys.argv[1:5])
