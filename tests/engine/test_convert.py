"""Converters: EAGLE-3 research and z-lab DFlash checkpoints become valid speculators drafts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.convert import detect, mapping_table
from engine.convert.base import convert
from engine.format.checkpoint import tensor_index
from engine.format.validate import validate_draft

ROOT = Path(__file__).resolve().parents[2]
H, NH, NKV, HD, I, V, VD = 32, 4, 2, 8, 64, 96, 48


def eagle3_research(folder: Path, *, pickled: bool = False) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "intermediate_size": I,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 2048, "vocab_size": V,
        "draft_vocab_size": VD, "model_type": "llama", "torch_dtype": "float16"}))
    sel = torch.sort(torch.randperm(V)[:VD]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[sel] = True
    state = {"fc.weight": torch.randn(H, 3 * H), "norm.weight": torch.ones(H), "lm_head.weight": torch.randn(VD, H),
             "d2t": sel - torch.arange(VD), "t2d": t2d,
             "midlayer.self_attn.q_proj.weight": torch.randn(NH * HD, 2 * H),
             "midlayer.self_attn.k_proj.weight": torch.randn(NKV * HD, 2 * H),
             "midlayer.self_attn.v_proj.weight": torch.randn(NKV * HD, 2 * H),
             "midlayer.self_attn.o_proj.weight": torch.randn(H, NH * HD),
             "midlayer.mlp.gate_proj.weight": torch.randn(I, H), "midlayer.mlp.up_proj.weight": torch.randn(I, H),
             "midlayer.mlp.down_proj.weight": torch.randn(H, I), "midlayer.input_layernorm.weight": torch.ones(H),
             "midlayer.hidden_norm.weight": torch.ones(H), "midlayer.post_attention_layernorm.weight": torch.ones(H)}
    if pickled:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file(state, str(folder / "model.safetensors"))
    return folder


def dflash_zlab(folder: Path, layers: int = 2) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": I,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "num_hidden_layers": layers,
        "rms_norm_eps": 1e-6, "vocab_size": V, "block_size": 8, "num_target_layers": 8,
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 3, 5, 7]}, "max_position_embeddings": 4096,
        "rope_theta": 1000000}))
    state = {"fc.weight": torch.randn(H, 4 * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H)}
    for i in range(layers):
        p = f"layers.{i}."
        state.update({p + "self_attn.qkv_proj.weight": torch.randn((NH + 2 * NKV) * HD, H),
                      p + "self_attn.o_proj.weight": torch.randn(H, NH * HD),
                      p + "self_attn.q_norm.weight": torch.ones(HD), p + "self_attn.k_norm.weight": torch.ones(HD),
                      p + "mlp.gate_proj.weight": torch.randn(I, H), p + "mlp.up_proj.weight": torch.randn(I, H),
                      p + "mlp.down_proj.weight": torch.randn(H, I), p + "input_layernorm.weight": torch.ones(H),
                      p + "post_attention_layernorm.weight": torch.ones(H), p + "self_attn.g_proj.weight": torch.ones(H)})
    save_file(state, str(folder / "model.safetensors"))
    return folder


def test_eagle3_research_detected_mapped_converted_and_valid(tmp_path):
    src = eagle3_research(tmp_path / "src")
    assert detect(src).format == "eagle3-research"
    table = dict(mapping_table(src))
    assert table["midlayer.hidden_norm.weight"] == "layers.0.hidden_norm.weight" and table["fc.weight"] == "fc.weight"
    out = convert(src, tmp_path / "out", verifier="org/verifier", aux_layer_ids=[1, 4, 6])
    report = validate_draft(out)
    assert report.ok, report.errors
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == VD
    assert cfg["transformer_layer_config"]["rope_parameters"]["rope_theta"] == 500000.0
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6] and cfg["norm_before_residual"] is False
    assert "layers.0.self_attn.q_proj.weight" in tensor_index(out)
    assert detect(out).format == "speculators"


def test_pickled_source_needs_permission(tmp_path):
    src = eagle3_research(tmp_path / "src", pickled=True)
    with pytest.raises(Exception, match="unpickling"):
        convert(src, tmp_path / "out", verifier="org/verifier")
    out = convert(src, tmp_path / "out", verifier="org/verifier", allow_pickle=True)
    assert validate_draft(out).ok


def test_dflash_zlab_layer_ids_shift_and_qkv_split(tmp_path):
    src = dflash_zlab(tmp_path / "src")
    assert detect(src).format == "dflash-zlab"
    assert dict(mapping_table(src))["layers.0.self_attn.g_proj.weight"] is None
    out = convert(src, tmp_path / "out", verifier="org/verifier")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["aux_hidden_state_layer_ids"] == [2, 4, 6]  # 7 + 1 == N (8) is the last layer: dropped
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    assert cfg["mask_token_id"] == 5 and cfg["sliding_window_non_causal"] is True
    names = tensor_index(out)
    assert names["fc.weight"].shape == (H, 3 * H) and names["layers.1.self_attn.k_proj.weight"].shape == (NKV * HD, H)
    report = validate_draft(out)
    assert report.ok, report.errors
    assert report.vllm_hf_config["dflash_config"]["target_layer_ids"] == [1, 3, 5]


def test_convert_cli_detect_and_convert(tmp_path):
    src = eagle3_research(tmp_path / "src")
    det = subprocess.run([sys.executable, "-m", "engine", "convert", str(src), "--detect", "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert det.returncode == 0 and json.loads(det.stdout)["format"] == "eagle3-research"
    run = subprocess.run([sys.executable, "-m", "engine", "convert", str(src), "--out", str(tmp_path / "o"),
                          "--target", "org/verifier", "--aux-layer-ids", "1,4,6"], capture_output=True, text=True,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "OK" in run.stdout
