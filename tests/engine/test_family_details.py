"""Family details that change what a draft sees, per family: the layer ids captured (vLLM's semantics), the plain
embedding a draft is given (Gemma scales it inside the target), the verifier's final norm as training applies it
((1 + w) for Gemma), and the target's KV cache rolling back rejected drafts past a sliding window."""

from __future__ import annotations

import pytest
import torch

from tiny import FAMILIES, save_tiny_target


@pytest.fixture(scope="module")
def family_targets(tmp_path_factory):
    from engine.targets.loading import load_target

    root = tmp_path_factory.mktemp("family-details")
    return {f: load_target(str(save_tiny_target(root / f, f))) for f in FAMILIES}


IDS = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11, 64, 128, 19, 33, 8, 200]])  # longer than the tiny windows (8)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_captured_layer_ids_are_the_residual_stream_vllm_records(family, family_targets):
    """id k < N = the input of decoder layer k (HF hidden_states[k]); id N = the last layer's output before the
    final norm, so the target's own final norm of it is HF's last hidden state."""
    from engine.targets.capture import capture_hidden_states

    target = family_targets[family]
    n = target.num_layers
    with torch.no_grad():
        hf = target.model(input_ids=IDS, output_hidden_states=True).hidden_states
    got = capture_hidden_states(target.model, IDS, range(1, n + 1))  # [1, T, N, H]
    for k in range(1, n):
        torch.testing.assert_close(got[0, :, k - 1], hf[k][0])
    torch.testing.assert_close(target.final_norm()(got[:, :, -1])[0], hf[-1][0])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_sees_what_decoding_gives_the_draft(family, family_targets):
    """The embedding and final norm training reads from the files equal the ones decoding uses: the plain lookup
    (vLLM shares the target's unscaled embedding module) and the family's own final norm."""
    from engine.targets.verifier import load_verifier_parts

    target = family_targets[family]
    parts = load_verifier_parts(target.ref.path)
    decode_embed = target.embed_tokens()
    assert type(decode_embed) is torch.nn.Embedding  # no family scale folded in
    torch.testing.assert_close(decode_embed(IDS), parts.embed_tokens()(IDS))
    torch.testing.assert_close(decode_embed(IDS), target.model.get_input_embeddings().weight[IDS])
    x = torch.randn(3, target.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(parts.final_norm_fn()(x), target.final_norm()(x))
        torch.testing.assert_close(parts.head_weight, target.lm_head().weight)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_targets_are_the_targets_own_logits(family, family_targets):
    """The distribution training matches is the target's own: norm, lm_head, then the family's logit transform
    (Gemma 2's final soft-capping, Granite's logits_scaling), against the logits of the target's forward."""
    from engine.algos.eagle3.train import target_logits
    from engine.targets.capture import capture_hidden_states
    from engine.targets.verifier import load_verifier_parts

    target = family_targets[family]
    parts = load_verifier_parts(target.ref.path)
    with torch.no_grad():
        own = target.model(input_ids=IDS).logits[0].float()                               # [T, V]
    last = capture_hidden_states(target.model, IDS, [target.num_layers])[0, :, 0]         # [T, H]
    got = target_logits(last, parts.final_norm_fn(), parts.head_weight, parts.logit_transform())
    torch.testing.assert_close(got, own, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", [f for f in FAMILIES if "sliding_window" in FAMILIES[f]])
def test_the_kv_cache_rolls_back_past_a_sliding_window(family, family_targets):
    """Verify 4 tokens past the window, reject 3 (crop), continue: the logits equal a fresh run of the same text."""
    from engine.generate.runner import TargetRunner

    target = family_targets[family]
    assert target.text_config.sliding_window < IDS.shape[1]
    runner = TargetRunner(target, route_kernels=False)
    ids = IDS[0].tolist()
    runner.forward(ids[:10])
    runner.forward([1, 2, 3, 4])  # a draft of 4, of which the first is kept
    runner.crop(11)
    got, _ = runner.forward(ids[10:])
    fresh = TargetRunner(target, route_kernels=False)
    want, _ = fresh.forward(ids[:10] + [1] + ids[10:])
    torch.testing.assert_close(got, want[-len(ids[10:]):], rtol=1e-4, atol=1e-4)


def test_the_models_page_family_table_lists_every_tested_family():
    from engine.data.plan import FAMILIES as DESCRIBED

    assert set(DESCRIBED) == {f.split(":")[0] for f in FAMILIES}  # "type:variant" keys share a type
