"""The bf16 decode kernels: same bits as transformers' own forward, rows independent of how many are verified,
and greedy speculative output exactly the baseline's on the built-in target in bf16 (no near-tie excuses)."""

from __future__ import annotations

import pytest
import torch

from engine.generate.cpu_kernels import ATTENTION, few_row_linear, route_decode_kernels
from engine.generate.runner import TargetRunner
from engine.targets import LayerCapture, decode_dtype, load_target

needs_bf16 = pytest.mark.skipif(decode_dtype("auto", "cpu") != torch.bfloat16,
                                reason="this CPU has no native bf16 matmul: the routing is not used here")


@pytest.mark.parametrize("rows", [1, 2, 4, 9, 33])
def test_few_row_linear_is_linear(rows):
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 40, dtype=torch.bfloat16), torch.randn(96, dtype=torch.bfloat16)
    x = torch.randn(1, rows, 40, dtype=torch.bfloat16)
    got = few_row_linear(weight, x, bias)
    assert got.shape == (1, rows, 96) and got.is_contiguous()
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1.6e-2, atol=1e-2)


def _layer_states(target, runner, prompt: list[int], chunks: list[list[int]]) -> list[torch.Tensor]:
    """The residual stream at every layer (+ logits) for the new tokens, fed in `chunks` after the prompt."""
    runner.reset()
    runner.forward(prompt, all_logits=False)
    rows = []
    for chunk in chunks:
        with LayerCapture(target.model, range(target.num_layers + 1)) as cap:
            logits, _ = runner.forward(chunk)
        rows.append(torch.cat([torch.cat([cap.captured[i][0] for i in cap.layer_ids], -1).float(), logits], -1))
    return list(torch.cat(rows))  # one [L*H + V] row per new token


@needs_bf16
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_routed_rows_are_bitwise_the_one_token_steps(tiny_targets, arch):
    target = load_target(str(tiny_targets[arch]), dtype="bf16")
    prompt, new = list(range(3, 40)), [50, 51, 52, 53, 54]
    from transformers import DynamicCache

    def plain_step(ids):
        with torch.inference_mode():
            return target.model(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[0].float()

    cache = DynamicCache(config=target.model.config)
    plain_step(prompt)
    before = [plain_step([t])[-1] for t in new]  # [V] each: transformers' own kernels, before routing
    runner = TargetRunner(target)  # routes the model
    assert target.model.config._attn_implementation == ATTENTION
    steps = _layer_states(target, runner, prompt, [[t] for t in new])
    block = _layer_states(target, runner, prompt, [new])
    for i, (a, b) in enumerate(zip(steps, block)):
        assert torch.equal(a, b), f"{arch}: row {i} of a {len(new)}-token forward differs from its one-token step"
    vocab = before[0].shape[0]
    for i, ref in enumerate(before):  # routed one-token steps compute what transformers' kernels do (the same
        # bits on this machine's oneDNN; another CPU's GEMV may round differently, so only closeness is asserted)
        torch.testing.assert_close(steps[i][-vocab:], ref, rtol=0.02, atol=0.02)


def test_fp32_and_gpu_shapes_are_left_alone(tiny_llama):
    assert not route_decode_kernels(tiny_llama.model)  # fp32: nothing routed
    assert tiny_llama.model.config._attn_implementation != ATTENTION


@pytest.fixture(scope="module")
def builtin_bf16():
    target = load_target("smollm2-135m-instruct", dtype="bf16")
    yield target
    del target


@needs_bf16
@pytest.mark.parametrize("method", ["draft", pytest.param("ngram", marks=pytest.mark.slow)])
def test_bf16_greedy_speculation_is_exactly_the_baseline_on_builtin(builtin_bf16, method):
    from engine.data.datasets import heldout_prompts
    from engine.generate.api import make_proposer, prompt_ids
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all

    target = builtin_bf16
    params = SamplingParams(max_new_tokens=32, eos_token_ids=[target.tokenizer.eos_token_id])
    proposer = make_proposer(method, target)
    base_runner, spec_runner = TargetRunner(target), TargetRunner(target, proposer.aux_layer_ids)
    accepted = 0
    for prompt in heldout_prompts("sharegpt", n=6, max_chars=600):
        ids = prompt_ids(target.tokenizer, prompt)
        base = generate_all(base_runner, ids, params)[0]
        out, events = generate_all(spec_runner, ids, params, proposer, k=4)
        assert out == base, f"{method}: bf16 speculative output differs from the baseline"
        accepted += sum(e.accepted for e in events)
    assert accepted > 0  # multi-token verification really happened
