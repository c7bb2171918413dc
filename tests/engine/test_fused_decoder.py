"""The fused decoder forward: transformers' logits and aux states for the layouts it takes, a reason for the rest."""

import pytest
import torch

from engine.generate import fused_decoder
from engine.generate import kernel_choice as kc
from engine.generate.fused_decoder import fused_problem
from engine.generate.runner import TargetRunner
from engine.targets.loading import load_target

pytestmark = pytest.mark.xdist_group("fused_decoder")


@pytest.fixture(scope="module")
def tiny_family_targets(tmp_path_factory):
    from tiny import save_tiny_target

    root = tmp_path_factory.mktemp("fused")
    return {arch: save_tiny_target(root / arch, arch) for arch in ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe",
                                                                     "gemma2")}


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), float((a - b).abs().max())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fused_forwards_give_transformers_logits_and_aux_states(tiny_family_targets, arch, monkeypatch):
    """fp32, so the comparison is tight: a prompt over several chunks and past the first cache size, one-token and
    several-token steps, and a crop (a rejected draft) followed by new tokens."""
    monkeypatch.setattr(fused_decoder, "PREFILL_CHUNK", 64)
    target = load_target(str(tiny_family_targets[arch]), dtype=torch.float32, device="cpu")
    aux = [1, 3, 4]  # a layer's input, and the last layer's output (id = number of layers)
    plain = TargetRunner(target, aux, route_kernels=False, fused=False)
    fused = TargetRunner(target, aux, route_kernels=False, fused=True)
    assert fused.fused and not plain.fused
    prompt = [(7 * i) % 300 + 3 for i in range(300)]  # 5 chunks, more than the 256 positions first allocated
    for step in (prompt, [5], [9, 11, 13, 15], [17]):
        (a, xa), (b, xb) = plain.forward(step), fused.forward(step)
        _close(a, b)
        _close(xa, xb)
        assert plain.length == fused.length
    for runner in (plain, fused):
        runner.crop(302)
    assert fused.length == 302
    (a, xa), (b, xb) = plain.forward([20, 21, 22]), fused.forward([20, 21, 22])
    _close(a, b)
    _close(xa, xb)
    (a, _), (b, _) = plain.forward([23], all_logits=False), fused.forward([23], all_logits=False)
    _close(a, b)


@pytest.mark.parametrize("arch,why", [("mistral", "sliding-window"), ("qwen3_moe", "qwen3_moe"),
                                      ("gemma2", "gemma2")])
def test_other_layouts_are_refused_with_the_reason_and_decode_as_before(tiny_family_targets, arch, why):
    target = load_target(str(tiny_family_targets[arch]), dtype=torch.float32, device="cpu")
    assert why in fused_problem(target.model)
    runner = TargetRunner(target, route_kernels=False, fused=True)
    assert not runner.fused
    logits, _ = runner.forward([3, 4, 5])
    assert logits.shape == (3, target.vocab_size)


def test_the_kernel_choice_skips_the_fused_path_where_the_layout_is_not_taken(tiny_family_targets):
    paths = ["fp32", "bf16-fused-packed-masked"]
    moe = kc.measure(str(tiny_family_targets["qwen3_moe"]), 3, paths, device="cpu", repeats=1)
    assert "qwen3_moe" in moe["bf16-fused-packed-masked"]["skipped"]
    assert moe["fp32"]["ms_1"] > 0
    assert kc.pick(moe) == "fp32"
    llama = kc.measure(str(tiny_family_targets["llama"]), 3, paths, device="cpu", repeats=1)
    assert llama["bf16-fused-packed-masked"]["ms_1"] > 0  # timed, its row exactness checked as every path's
    # what the choice says of its row exactness is what the fused path does here: several rows against one-token
    # steps, bit for bit, checked by the test itself on its own runner
    path = kc.PATHS["bf16-fused-packed-masked"]
    target = load_target(str(tiny_family_targets["llama"]), dtype=path.dtype, device="cpu", with_tokenizer=False)
    path.prepare(target.model)
    runner = TargetRunner(target, route_kernels=path.routed, fused=path.fused)
    prompt = [5 + i % 50 for i in range(24)]
    runner.reset()
    runner.forward(prompt, all_logits=False)
    exact = True
    for n in sorted({3 + 1, *kc.EXACT_ROWS}):
        new = [(11 * j + 3) % target.vocab_size for j in range(n)]
        runner.crop(len(prompt))
        block, _ = runner.forward(new)
        runner.crop(len(prompt))
        steps = torch.cat([runner.forward([t])[0] for t in new])
        exact &= bool(torch.equal(block, steps))
    assert llama["bf16-fused-packed-masked"]["row_exact"] is exact


def test_paths_that_copy_the_weights_are_skipped_where_the_copy_would_not_fit(tiny_family_targets, monkeypatch):
    size = sum(p.numel() * p.element_size()
               for p in load_target(str(tiny_family_targets["llama"]), dtype=torch.bfloat16).model.parameters())
    monkeypatch.setattr(kc, "_free_memory", lambda: size)  # a second copy would take all of it
    paths = ["bf16-routed-linear-masked", "bf16-routed-packed-masked", "bf16-fused-packed-masked"]
    measured = kc.measure(str(tiny_family_targets["llama"]), 3, paths, device="cpu", repeats=1)
    assert measured["bf16-routed-linear-masked"]["ms_1"] > 0
    for name in paths[1:]:
        assert "second copy of the weights" in measured[name]["skipped"]


@pytest.mark.parametrize("arch,extra", [
    ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}, tie_word_embeddings=True,
                   attention_bias=True, mlp_bias=True, head_dim=24)),
    ("mistral", dict(sliding_window=None)),
])
def test_variants_of_the_layouts_decode_as_transformers(tmp_path, arch, extra):
    """Llama with Llama 3 RoPE scaling, a tied head, biases everywhere and a head size not hidden / heads; Mistral
    without a sliding window."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tiny import tiny_config, tiny_tokenizer

    base = tiny_config(arch if arch == "llama" else "llama").to_dict()
    for key in ("architectures", "model_type", "transformers_version", "dtype", "torch_dtype"):
        base.pop(key, None)
    config = AutoConfig.for_model(arch, **{**base, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    target = load_target(str(tmp_path), dtype=torch.float32, device="cpu")
    assert fused_problem(target.model) is None
    plain = TargetRunner(target, [2], route_kernels=False, fused=False)
    fused = TargetRunner(target, [2], route_kernels=False, fused=True)
    prompt = [(5 * i) % 300 + 3 for i in range(90)]  # past the 64 positions Llama 3's scaling treats as original
    for step in (prompt, [7], [8, 9, 10]):
        (a, xa), (b, xb) = plain.forward(step), fused.forward(step)
        _close(a, b)
        _close(xa, xb)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_batch_of_rows_at_different_lengths_steps_as_each_row_alone(tiny_family_targets, arch):
    """fp32: prompts of different lengths prefilled into one batch cache, then one step for all rows at a time gives
    each row what transformers gives that sequence alone (logits, captured streams); a row that leaves the batch
    leaves the others' caches intact, and the cache grows past its first capacity (at a prefill and at a step)."""
    target = load_target(str(tiny_family_targets[arch]), dtype=torch.float32, device="cpu")
    model, aux = target.model, [1, 4]
    prompts = [[(5 * i + 3 * r) % 300 + 3 for i in range(n)] for r, n in enumerate((7, 30, 13))]
    batch = fused_decoder.FusedBatch(model, len(prompts), capacity=8)
    alone = [TargetRunner(target, aux, route_kernels=False, fused=False) for _ in prompts]
    for b, prompt in enumerate(prompts):
        out, captured = batch.prefill(b, torch.tensor(prompt), aux)
        logits, states = alone[b].forward(prompt, all_logits=False)
        _close(batch.logits(out[-1:]), logits)
        _close(torch.cat([captured[i] for i in aux], dim=-1), states)
    rows, ids = [0, 1, 2], [11, 12, 13]
    for step in range(4):
        if step == 2:  # the middle row ends
            batch.keep([0, 2])
            rows, ids = [0, 2], [ids[0], ids[2]]
        out, captured = batch.step(torch.tensor(ids), aux)  # [B, H]
        got = batch.logits(out)
        for j, b in enumerate(rows):
            logits, states = alone[b].forward([ids[j]])
            _close(got[j: j + 1], logits)
            _close(torch.cat([captured[i][j: j + 1] for i in aux], dim=-1), states)
        ids = [int(x) for x in got.argmax(-1)]
    assert batch.lengths.tolist() == [len(prompts[0]) + 4, len(prompts[2]) + 4]
    assert batch._k.shape[3] == 2 * len(prompts[1])  # grown to the longest prompt, then doubled at its first step


def test_a_narrow_batch_refills_its_rows_and_answers_as_a_wide_one(tiny_family_targets):
    """greedy_batch with 2 rows for 5 prompts (each ending row taken by the next prompt) gives every prompt the answer
    and captured states it gets with a row each."""
    target = load_target(str(tiny_family_targets["llama"]), dtype=torch.float32, device="cpu")
    prompts = [[(3 * i + 7 * r) % 300 + 3 for i in range(n)] for r, n in enumerate((5, 17, 9, 30, 12))]

    def run(width, stops):
        ends = {e.index: (list(e.new), e.states) for e in fused_decoder.greedy_batch(
            target.model, prompts, stops, 9, width=width, capture=[1, 4], dtype=torch.float32)}
        return [ends[b] for b in range(len(prompts))]

    unstopped = run(None, set())
    stops = {unstopped[1][0][2], unstopped[3][0][4]}  # tokens two answers reach: they end there
    narrow, wide = run(2, stops), run(None, stops)
    for (new_a, states_a), (new_b, states_b) in zip(narrow, wide, strict=True):
        assert new_a == new_b
        _close(states_a, states_b)
    assert {len(new) for new, _ in wide} != {9}  # some answer ended early, so a row was refilled mid-run


def test_the_batch_memory_check_is_made_before_the_copy_only(tiny_family_targets, monkeypatch):
    """No room for a second copy: greedy batches keep transformers; once the copy exists, it no longer counts."""
    target = load_target(str(tiny_family_targets["qwen2"]), dtype=torch.float32)
    size = sum(p.numel() * p.element_size() for p in target.model.parameters())
    monkeypatch.setattr(kc, "_free_memory", lambda: size)
    assert "free memory" in kc.fused_batch_problem(target.model)
    fused_decoder.fused_weights(target.model)
    assert kc.fused_batch_problem(target.model) is None
