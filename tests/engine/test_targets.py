"""Targets: built-in preparation, loading, and hidden-state capture with vLLM/speculators layer semantics."""

from __future__ import annotations

import json

import pytest
import torch

from engine.targets.capture import LayerCapture, capture_hidden_states
from engine.targets.loading import load_target
from engine.targets.resolve import BUILTIN_TARGETS, resolve_target


def _reference(model, ids):
    out = model(ids, output_hidden_states=True)
    return out.hidden_states


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_capture_matches_hf_hidden_states_and_last_id_is_pre_norm(tiny_targets, arch):
    target = load_target(str(tiny_targets[arch]))
    n = target.num_layers
    ids = torch.randint(3, target.vocab_size, (2, 17))
    ref = _reference(target.model, ids)
    layer_ids = [0, 1, n - 1, n]
    got = capture_hidden_states(target.model, ids, layer_ids)
    assert got.shape == (2, 17, 4, target.hidden_size)
    for j, k in enumerate(layer_ids[:-1]):
        torch.testing.assert_close(got[:, :, j], ref[k])
    # id N is BEFORE the final norm: HF's last hidden state is the normed one.
    assert not torch.allclose(got[:, :, -1], ref[-1])
    torch.testing.assert_close(target.final_norm()(got[:, :, -1]), ref[-1])


def test_capture_sorts_ids_and_survives_in_place_reuse(tiny_llama):
    ids = torch.randint(3, tiny_llama.vocab_size, (1, 9))
    a = capture_hidden_states(tiny_llama.model, ids, [4, 2])
    b = capture_hidden_states(tiny_llama.model, ids, [2, 4])
    torch.testing.assert_close(a, b)
    with LayerCapture(tiny_llama.model, [4]) as cap:
        out = tiny_llama.model(ids)
    # the captured pre-norm state must not have been turned into the normed one
    torch.testing.assert_close(tiny_llama.final_norm()(cap.captured[4]), _reference(tiny_llama.model, ids)[-1])
    assert out.logits.shape[-1] == tiny_llama.vocab_size  # hooks do not stop a normal forward


def test_capture_rejects_ids_outside_depth(tiny_llama):
    with pytest.raises(Exception, match="outside 0..4"):
        capture_hidden_states(tiny_llama.model, torch.ones(1, 3, dtype=torch.long), [5])


def test_default_aux_layers():
    from engine.format.config import vllm_default_aux_layer_ids as default_aux_layer_ids

    assert default_aux_layer_ids(30) == [2, 15, 27]
    assert default_aux_layer_ids(32) == [2, 16, 29]
    assert default_aux_layer_ids(36) == [2, 18, 33]


def test_builtin_target_is_cached_fp32_folder_with_hub_identity(builtin_target):
    assert builtin_target.ref.builtin and builtin_target.verifier_name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert builtin_target.num_layers == 30 and builtin_target.hidden_size == 576
    assert builtin_target.vocab_size == 49152 and builtin_target.dtype == torch.float32
    folder = resolve_target("smollm2-135m-instruct").path
    cfg = json.loads(open(f"{folder}/config.json").read())
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    # the hub id resolves to the same offline copy
    assert resolve_target(BUILTIN_TARGETS["smollm2-135m-instruct"].hub_id).path == folder
    tok = builtin_target.tokenizer
    assert tok.eos_token_id == 2 and tok.convert_tokens_to_ids("<|im_start|>") == 1


def test_builtin_capture_semantics(builtin_target):
    text = builtin_target.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                                        add_generation_prompt=True, tokenize=False)
    ids = builtin_target.tokenizer(text, return_tensors="pt").input_ids
    ref = _reference(builtin_target.model, ids)
    got = capture_hidden_states(builtin_target.model, ids, [2, 15, 27, 30])
    for j, k in enumerate([2, 15, 27]):
        torch.testing.assert_close(got[:, :, j], ref[k])
    torch.testing.assert_close(builtin_target.final_norm()(got[:, :, 3]), ref[30], rtol=1e-5, atol=1e-5)
    assert (got[:, :, 3] - ref[30]).abs().max() > 1.0


def test_unknown_target_gives_clear_error(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(Exception, match="not a model folder"):
        resolve_target(str(tmp_path / "x"))
    with pytest.raises(Exception, match="no config.json"):
        resolve_target(str(tmp_path))
