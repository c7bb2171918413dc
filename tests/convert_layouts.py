"""Tiny synthetic checkpoints in every source layout the converters read (random weights, the real key names and
config fields), sized to pair with the tiny targets of tests/tiny.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# the tiny targets' dimensions (tests/tiny.py): a converted draft pairs with them; FF: the MLP (intermediate) width
H, NH, NKV, HD, FF, V, N = 64, 4, 2, 16, 128, 384, 4
VD = 96  # reduced draft vocabulary


def vocab_maps(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sel = torch.sort(torch.randperm(V, generator=g)[:VD]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[sel] = True
    return sel - torch.arange(VD), t2d  # d2t [VD] int64, t2d [V] bool


def layer_tensors(prefix: str, in_dim: int, *, qk_norm: bool = False, first: bool = True) -> dict[str, torch.Tensor]:
    out = {f"{prefix}self_attn.q_proj.weight": torch.randn(NH * HD, in_dim) * 0.1,
           f"{prefix}self_attn.k_proj.weight": torch.randn(NKV * HD, in_dim) * 0.1,
           f"{prefix}self_attn.v_proj.weight": torch.randn(NKV * HD, in_dim) * 0.1,
           f"{prefix}self_attn.o_proj.weight": torch.randn(H, NH * HD) * 0.1,
           f"{prefix}mlp.gate_proj.weight": torch.randn(FF, H) * 0.1,
           f"{prefix}mlp.up_proj.weight": torch.randn(FF, H) * 0.1,
           f"{prefix}mlp.down_proj.weight": torch.randn(H, FF) * 0.1,
           f"{prefix}input_layernorm.weight": 1 + 0.1 * torch.randn(H),
           f"{prefix}post_attention_layernorm.weight": 1 + 0.1 * torch.randn(H)}
    if first:
        out[f"{prefix}hidden_norm.weight"] = 1 + 0.1 * torch.randn(H)
    if qk_norm:
        out[f"{prefix}self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(HD)
        out[f"{prefix}self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(HD)
    return out


def llama_config(**extra) -> dict:
    # the fields SafeAILab's / SpecForge's EAGLE-3 configs carry (LlamaConfig + draft_vocab_size)
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
            "intermediate_size": FF, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
            "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "rope_scaling": None, "max_position_embeddings": 1024, "vocab_size": V, "draft_vocab_size": VD,
            "tie_word_embeddings": False, "torch_dtype": "float32", **extra}


def write_checkpoint(folder: Path, config: dict, state: dict, *, pickled: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if pickled:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def eagle3_head(seed: int, *, embed: bool = False, t2d: bool = True) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    d2t, t2d_map = vocab_maps(seed)
    state = {"fc.weight": torch.randn(H, 3 * H) * 0.1, "norm.weight": 1 + 0.1 * torch.randn(H),
             "lm_head.weight": torch.randn(VD, H) * 0.3, "d2t": d2t}
    if t2d:
        state["t2d"] = t2d_map
    if embed:
        state["embed_tokens.weight"] = torch.randn(V, H) * 0.3
    return state


def safeailab(folder: Path, *, pickled: bool = True) -> Path:
    """SafeAILab/EAGLE EAGLE-3 (cnets `Model`: midlayer, fc, norm, lm_head, d2t/t2d), uploaded as pytorch_model.bin."""
    state = eagle3_head(0) | {"midlayer." + k: v for k, v in layer_tensors("", 2 * H).items()}
    return write_checkpoint(folder, llama_config(), state, pickled=pickled)


def specforge(folder: Path) -> Path:
    """SpecForge LlamaForCausalLMEagle3 (save_pretrained: safetensors, its own embed_tokens)."""
    state = eagle3_head(1, embed=True) | {"midlayer." + k: v for k, v in layer_tensors("", 2 * H).items()}
    return write_checkpoint(folder, llama_config(max_window_layers=1, use_sliding_window=False), state)


def modelopt(folder: Path, layers: int = 2) -> Path:
    """NVIDIA ModelOpt export: eagle_config, midlayer.{i}.* for several layers, d2t without t2d."""
    state = eagle3_head(2, t2d=False)
    for i in range(layers):
        state |= {f"midlayer.{i}." + k: v for k, v in layer_tensors("", 2 * H if i == 0 else H, first=i == 0).items()}
    cfg = llama_config(num_hidden_layers=layers, eagle_config={
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True,
        "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_mtp_layernorm": False,
        "next_layer_regular": True, "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 0})
    return write_checkpoint(folder, cfg, state)


def qwen3_layers(folder: Path) -> Path:
    """An EAGLE-3 draft with Qwen3 layers (Qwen3ForCausalLMEagle3: q_norm/k_norm, eagle_config aux ids)."""
    state = eagle3_head(3) | {"midlayer." + k: v for k, v in layer_tensors("", 2 * H, qk_norm=True).items()}
    cfg = llama_config(architectures=["Qwen3ForCausalLMEagle3"], model_type="qwen3",
                        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    return write_checkpoint(folder, cfg, state)


def dflash_zlab(folder: Path, layers: int = 2) -> Path:
    """z-lab DFlash (dflash_config.target_layer_ids in output numbering, fused qkv, g_proj gates)."""
    torch.manual_seed(4)
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": FF,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "num_hidden_layers": layers,
           "rms_norm_eps": 1e-6, "vocab_size": V, "block_size": 4, "num_target_layers": N,
           "dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 1, 2]}, "max_position_embeddings": 1024,
           "rope_theta": 1000000, "tie_word_embeddings": False}
    state = {"fc.weight": torch.randn(H, 3 * H) * 0.1, "hidden_norm.weight": torch.ones(H),
             "norm.weight": torch.ones(H)}
    for i in range(layers):
        layer = layer_tensors(f"layers.{i}.", H, qk_norm=True, first=False)
        q, k, v = (layer.pop(f"layers.{i}.self_attn.{p}_proj.weight") for p in "qkv")
        layer[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat([q, k, v])
        layer[f"layers.{i}.self_attn.g_proj.weight"] = torch.ones(H)
        state |= layer
    return write_checkpoint(folder, cfg, state)


MASK = 383  # the tiny vocabulary's token the parallel slots / block mask slots were "trained" with
R = 8  # DSpark's Markov rank


def peagle_layers(first_prefix: str, layers: int) -> dict[str, torch.Tensor]:
    """P-EAGLE's decoder: layer 0 reads [embedding; hidden] (2H) and has hidden_norm, later layers read H."""
    out = {}
    for i in range(layers):
        prefix = first_prefix if i == 0 else f"layers.{i}."
        out |= {prefix + k: v for k, v in layer_tensors("", 2 * H if i == 0 else H, first=i == 0).items()}
    return out


def peagle_specforge(folder: Path, layers: int = 2) -> Path:
    """SpecForge PEagleDraftModel (train_peagle.py): layers.{i}.*, mask_hidden, own embed_tokens, reduced vocabulary
    maps, a Llama config, and peagle_config.json with the mask token and the depths."""
    state = eagle3_head(5, embed=True) | {"mask_hidden": torch.randn(1, 1, 3 * H)} | peagle_layers("layers.0.", layers)
    write_checkpoint(folder, llama_config(architectures=["PEagleDraftModel"], num_hidden_layers=layers), state)
    (folder / "peagle_config.json").write_text(json.dumps({
        "num_depths": 4, "down_sample_ratio": 0.7, "down_sample_ratio_min": 0.2, "mask_token_id": MASK,
        "num_draft_layers": layers, "norm_before_residual": False}))
    return folder


def peagle_aws(folder: Path, layers: int = 2) -> Path:
    """An AWS hub P-EAGLE (vLLM's eagle3 + parallel_drafting layout): midlayer.* then layers.{i}.*, mask_hidden,
    own embed_tokens, the full vocabulary (identity d2t/t2d) and ptd_token_id in a Llama config."""
    torch.manual_seed(6)
    state = {"fc.weight": torch.randn(H, 3 * H) * 0.1, "norm.weight": 1 + 0.1 * torch.randn(H),
             "lm_head.weight": torch.randn(V, H) * 0.3, "embed_tokens.weight": torch.randn(V, H) * 0.3,
             "mask_hidden": torch.randn(1, 1, 3 * H), "d2t": torch.zeros(V, dtype=torch.long),
             "t2d": torch.ones(V, dtype=torch.bool)} | peagle_layers("midlayer.", layers)
    cfg = llama_config(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=layers, draft_vocab_size=V,
                        ptd_token_id=MASK)
    return write_checkpoint(folder, cfg, state)


def dspark_deepspec(folder: Path, layers: int = 2, shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> Path:
    """DeepSpec Qwen3DSparkModel: Qwen3 block layers, fc/hidden_norm/norm, Markov and confidence heads, copies of the
    verifier's embedding and head (`shared`, else random), target_layer_ids in output numbering."""
    torch.manual_seed(7)
    embed, head = shared if shared is not None else (torch.randn(V, H) * 0.3, torch.randn(V, H) * 0.3)
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": FF,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "num_hidden_layers": layers,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": V, "max_position_embeddings": 1024,
           "rope_theta": 1000000, "tie_word_embeddings": False, "attention_bias": False,
           "layer_types": ["full_attention"] * layers, "sliding_window": None, "use_sliding_window": False,
           "num_target_layers": N, "block_size": 4, "mask_token_id": MASK, "target_layer_ids": [0, 1, 2],
           "num_anchors": 512, "enable_confidence_head": True, "confidence_head_with_markov": True,
           "markov_rank": R, "markov_head_type": "vanilla"}
    state = {"embed_tokens.weight": embed.clone(), "lm_head.weight": head.clone(),
             "fc.weight": torch.randn(H, 3 * H) * 0.1, "hidden_norm.weight": 1 + 0.1 * torch.randn(H),
             "norm.weight": 1 + 0.1 * torch.randn(H), "markov_head.markov_w1.weight": torch.randn(V, R) * 0.3,
             "markov_head.markov_w2.weight": torch.randn(V, R) * 0.3,
             "confidence_head.proj.weight": torch.randn(1, H + R) * 0.1, "confidence_head.proj.bias": torch.randn(1)}
    for i in range(layers):
        state |= layer_tensors(f"layers.{i}.", H, qk_norm=True, first=False)
    return write_checkpoint(folder, cfg, state)


RANK, TAPS, GROUP = 8, 2, 16  # DFlash2's selector rank, convolution taps and channels per kernel


def dflash2_zlab(folder: Path, layers: int = 2, *, multiplier: float = 1.0, codebook_suffix: str = "",
                 extra: dict | None = None) -> Path:
    """z-lab DFlash2 (DFlash2DraftModel): z-lab DFlash's config with the DFlash2 settings, output scaling and the
    mask token inside dflash_config (target_layer_ids in output numbering), per-layer attention_conv/mlp_conv and
    the candidate selector (`codebook_suffix` ".weight": codebooks saved as Embeddings)."""
    torch.manual_seed(8)
    dc = {"block_size": 4, "conv_group_size": GROUP, "conv_kernel_size": TAPS, "mask_token_id": MASK,
          "selector_rank": RANK, "selector_top_k": 16, "target_layer_ids": [0, 1, 2], "output_multiplier": multiplier,
          **(extra or {})}
    cfg = {"architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": FF,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "num_hidden_layers": layers,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": V, "max_position_embeddings": 1024,
           "rope_theta": 1000000, "tie_word_embeddings": False, "attention_bias": False, "is_causal": False,
           "layer_types": ["full_attention"] * layers, "num_target_layers": N, "use_cache": False, "dflash_config": dc}
    state = {"fc.weight": torch.randn(H, 3 * H) * 0.1, "hidden_norm.weight": 1 + 0.1 * torch.randn(H),
             "norm.weight": 1 + 0.1 * torch.randn(H),
             f"candidate_selector.predecessor_codebook{codebook_suffix}": torch.randn(V, RANK) * 0.5,
             f"candidate_selector.successor_codebook{codebook_suffix}": torch.randn(V, RANK) * 0.5,
             "candidate_selector.hidden_projection.weight": torch.randn(RANK, H) * 0.5}
    for i in range(layers):
        state |= layer_tensors(f"layers.{i}.", H, qk_norm=True, first=False)
        for conv in ("attention_conv", "mlp_conv"):
            state[f"layers.{i}.{conv}.base_kernel"] = torch.randn(2, TAPS, H) * 0.5
            state[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.randn(2 * TAPS * (H // GROUP), H) * 0.1
    return write_checkpoint(folder, cfg, state)


LAYOUTS = {"eagle3-safeailab": safeailab, "eagle3-specforge": specforge, "eagle3-modelopt": modelopt,
           "eagle3-qwen3": qwen3_layers, "dflash-zlab": dflash_zlab, "peagle-specforge": peagle_specforge,
           "peagle-aws": peagle_aws, "dspark-deepspec": dspark_deepspec,
           "dflash2-zlab": dflash2_zlab}
