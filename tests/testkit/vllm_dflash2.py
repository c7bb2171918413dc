"""Run by vLLM's interpreter (.venv-vllm), never imported: vLLM's own DFlash2 pieces on a DFlash2 checkpoint and
the inputs the test wrote, outputs back as safetensors.

    python -P vllm_dflash2.py CHECKPOINT_DIR INPUTS.safetensors OUTPUTS.safetensors BLOCK TOP_K
"""

# Inputs: conv_in, conv_mid [T, H] (whole blocks of BLOCK = 1 + k rows, as vLLM's runner lays them out), hidden
# [n, s, H] (normed outputs of the drafting slots), anchors [n], head [V, H] (the target's lm_head). Outputs: per
# layer i and side (attention_conv, mlp_conv) `{i}.{side}.prepared` = DFlashGroupedConv.prepare(conv_in)[0] and
# `{i}.{side}.finished` = finish(conv_mid, the deltas prepare returned); `candidates`, `unary` [n, s, K] (the draft
# head's get_top_k_tokens), `edges` [n, s, K, K] (`_score_edges`) and `tokens` [n, s]: the greedy path of
# `_selector_walk_kernel` (step 0 reads row 0, then the row of the candidate chosen before).

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main(folder: str, inputs: str, outputs: str, block: int, top_k: int) -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:29531",
                                     local_rank=0, backend="gloo")
        initialize_model_parallel(1)
        save_file(run(Path(folder), load_file(inputs), block, top_k), outputs)


def load(module: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str) -> None:
    """Checkpoint tensors into a vLLM module through its own weight loaders (a missing name raises KeyError)."""
    for name, param in module.named_parameters():
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            param.data.copy_(tensors[prefix + name])
        else:
            loader(param, tensors[prefix + name])
    for sub in module.modules():
        method = getattr(sub, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(sub)


def run(folder: Path, x: dict[str, torch.Tensor], block: int, top_k: int) -> dict[str, torch.Tensor]:
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_dflash2 import DFlashGroupedConv, _score_edges

    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    hidden_size = cfg["transformer_layer_config"]["hidden_size"]
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg["transformer_layer_config"]["num_hidden_layers"]):
        for side in ("attention_conv", "mlp_conv"):
            conv = DFlashGroupedConv(hidden_size=hidden_size, taps=cfg["conv_kernel_size"],
                                     group_size=cfg["conv_group_size"], block_size=block,
                                     params_dtype=torch.float32, prefix=f"layers.{i}.{side}")
            load(conv, tensors, f"layers.{i}.{side}.")
            with torch.no_grad():
                prepared, delta = conv.prepare(x["conv_in"])
                out[f"{i}.{side}.prepared"] = prepared
                out[f"{i}.{side}.finished"] = conv.finish(x["conv_mid"], delta)

    vocab, rank = x["head"].shape[0], cfg["selector_rank"]
    head = ParallelLMHead(vocab, hidden_size, params_dtype=torch.float32)
    load(head, {"weight": x["head"]}, "")
    projection = ReplicatedLinear(hidden_size, rank, bias=False, params_dtype=torch.float32,
                                  prefix="candidate_selector.hidden_projection", return_bias=False)
    load(projection, tensors, "candidate_selector.hidden_projection.")
    hidden = x["hidden"]
    n, s = hidden.shape[:2]
    with torch.no_grad():
        candidates, unary = LogitsProcessor(vocab).get_top_k_tokens(head, hidden.flatten(0, 1), top_k)
        candidates, unary = candidates.view(n, s, top_k), unary.view(n, s, top_k)
        edges = _score_edges(tensors["candidate_selector.predecessor_codebook"],
                             tensors["candidate_selector.successor_codebook"], candidates, unary,
                             projection(hidden.flatten(0, 1)).view(n, s, rank), x["anchors"], top_k)
    tokens = torch.zeros(n, s, dtype=torch.long)
    for row in range(n):
        previous = 0
        for step in range(s):
            previous = int(edges[row, step, previous].argmax())
            tokens[row, step] = candidates[row, step, previous]
    out.update({"candidates": candidates.contiguous(), "unary": unary.contiguous(), "edges": edges.contiguous(),
                "tokens": tokens})
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
