"""DFlash: lossless block drafting (greedy and sampled), decoding = training blocks, training, checkpoints vLLM's
rules accept, and the offline evaluator's walk equal to real decoding."""

from __future__ import annotations

import pytest
import torch

from engine.algos import ALGOS
from engine.algos.dflash.io import build_dflash, load_dflash
from engine.generate import speculative
from engine.generate.api import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate_all

from test_generate import PROMPTS  # the decode engine's own prompts


@pytest.fixture(scope="module")
def tiny(tiny_targets):
    """A private copy of the tiny target: DFlash drafts share (and freeze) its embedding."""
    from engine.targets import load_target

    return load_target(str(tiny_targets["llama"]))


@pytest.fixture(scope="module")
def tiny_dflash(tiny):
    counts = torch.arange(tiny.vocab_size).flip(0)  # reduced vocabulary: exercises d2t
    return build_dflash(tiny, aux_layer_ids=[1, 2, 3], num_layers=2, block_size=4, draft_vocab_size=160,
                        token_counts=counts).eval()


def proposer(draft):
    return ALGOS.get("dflash").proposer(draft)


@pytest.mark.parametrize("k", [1, 2, 3])  # k < B-1 is a shorter block read
def test_greedy_block_drafting_equals_baseline_on_tiny(tiny, tiny_dflash, k):
    params = SamplingParams(max_new_tokens=24)
    for text in PROMPTS:
        ids = prompt_ids(tiny.tokenizer, text)
        base, _ = generate_all(TargetRunner(tiny), ids, params)
        prop = proposer(tiny_dflash)
        spec, events = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, params, prop, k)
        assert spec == base
        assert max(e.drafted for e in events) == min(k, 3)  # one block forward drafts up to B-1 tokens


def test_proposer_block_equals_the_training_block(tiny, tiny_dflash):
    """The cached decoding path (committed context K/V + one block) computes the batched training block."""
    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = proposer(tiny_dflash)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    logits, aux = runner.forward(ids, all_logits=False)
    first = int(logits[-1].argmax())
    prop.start(ids, aux, first)
    drafted = prop.propose(3, SamplingParams(), None).tokens
    seq = torch.tensor(ids + [first])
    full_aux = torch.cat([aux, torch.zeros(1, aux.shape[1])])  # the anchor's own feature is never read
    blocks = tiny_dflash.anchored_blocks(full_aux[None], seq[None], torch.arange(len(seq))[None],
                                         torch.zeros(1, len(seq), dtype=torch.long), torch.tensor([len(ids)]))
    assert drafted == tiny_dflash.draft_to_target(blocks[0, 1:4].argmax(-1)).tolist()


def test_draft_proposing_eos_inside_the_block_stops_like_baseline(tiny, tiny_dflash, monkeypatch):
    ids = prompt_ids(tiny.tokenizer, PROMPTS[0])
    params = SamplingParams(max_new_tokens=24)
    base, _ = generate_all(TargetRunner(tiny), ids, params)
    eos = base[5]  # treat the 6th baseline token as EOS: generation must stop right after it
    params = SamplingParams(max_new_tokens=24, eos_token_ids=[eos])
    expected, _ = generate_all(TargetRunner(tiny), ids, params)
    prop = proposer(tiny_dflash)
    out, _ = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, params, prop, 3)
    assert out == expected and out[-1] == eos


def test_sampled_block_drafting_matches_the_target_distribution(tiny, tiny_dflash):
    from test_generate import chi_square_pvalue, second_token_distribution  # the engine's own checks

    params = SamplingParams(max_new_tokens=2, temperature=1.0, top_k=40)
    prompt = prompt_ids(tiny.tokenizer, "hello")
    exact = second_token_distribution(tiny, prompt, params)
    counts = torch.zeros(tiny.vocab_size)
    prop = proposer(tiny_dflash)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    for seed in range(1200):
        params.seed = seed
        out, _ = generate_all(runner, prompt, params, prop, k=2)
        counts[out[1]] += 1
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_evaluator_walk_equals_decoding(tiny, tiny_dflash):
    from engine.measure.evaluate import evaluate_samples, samples_from_prompts

    algo = ALGOS.get("dflash")
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    samples = samples_from_prompts(tiny, prompts, algo.aux_layer_ids(tiny_dflash), max_new_tokens=20)
    result = evaluate_samples(algo, tiny_dflash, samples, [1, 3], max_new_tokens=20, keep_walks=True)
    params = SamplingParams(max_new_tokens=20, eos_token_ids=[tiny.tokenizer.eos_token_id])
    for k in (1, 3):
        for prompt, walked in zip(prompts, result["walks"][str(k)]):
            ids = prompt_ids(tiny.tokenizer, prompt)
            prop = proposer(tiny_dflash)
            _, events = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, params, prop, k)
            steps = [(e.drafted, e.accepted) for e in events if e.step > 0]
            assert steps == list(zip(walked["drafted"], walked["accepted"]))


def test_dflash_trains_and_writes_a_checkpoint_vllm_rules_accept(tiny_targets, tmp_path):
    import json

    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer

    cfg = TrainConfig(algo="dflash", target=str(tiny_targets["llama"]), online_dataset="sharegpt",
                      online_max_samples=16, out=str(tmp_path / "run"), tokens_per_batch=384, max_length=128,
                      epochs=8, warmup_steps=2, lr=3e-3, val_fraction=0.25, val_every=8, checkpoint_every=1000,
                      algo_args={"num_layers": 1, "block_size": 4, "max_anchors": 64})
    final = Trainer(cfg).run()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"]
    assert val[-1]["loss"] < val[0]["loss"]
    assert {"full_acc_0", "pos_acc_2", "est_acceptance_length", "walk_acceptance_length"} <= set(val[-1])
    report = validate_draft(final)
    assert report.ok, [i.message for i in report.errors]
    names = set(tensor_index(final))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight"} <= names
    assert not names & {"lm_head.weight", "embed_tokens.weight", "mask_hidden", "d2t"}  # full vocab: shared head
    config = json.loads((final / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == 4
    assert config["sliding_window_non_causal"] is True  # bidirectional blocks: vLLM serves causal = False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    from engine.targets import load_target

    assert load_dflash(final, load_target(str(tiny_targets["llama"]))).block_size == 4


def test_builtin_greedy_identity_on_8_prompts(builtin_target):
    """Greedy block drafting on the built-in target (fp32) gives the target's own text (the default variant of the
    50-prompt test)."""
    _builtin_identity(builtin_target, 8)


@pytest.mark.slow
def test_builtin_greedy_identity_on_50_prompts(builtin_target):
    """The same on 50 held-out prompts."""
    _builtin_identity(builtin_target, 50)


def _builtin_identity(builtin_target, n: int) -> None:
    from engine.data.prompts import load_prompts

    draft = build_dflash(builtin_target, num_layers=1, block_size=8).eval()
    params = SamplingParams(max_new_tokens=12, eos_token_ids=[builtin_target.tokenizer.eos_token_id])
    prompts = load_prompts("sharegpt", n, 0, 300)
    assert len(prompts) == n
    base_runner = TargetRunner(builtin_target)
    for prompt in prompts:
        ids = prompt_ids(builtin_target.tokenizer, prompt)
        base, _ = generate_all(base_runner, ids, params)
        prop = proposer(draft)
        spec, _ = generate_all(TargetRunner(builtin_target, prop.aux_layer_ids), ids, params, prop, 7)
        assert spec == base


def test_a_broken_acceptance_rule_is_caught(tiny, tiny_dflash, monkeypatch):
    """The greedy identity check can fail: accepting every draft changes the text."""
    monkeypatch.setattr(speculative, "verify_greedy", lambda drafts, logits: speculative.Verdict(len(drafts), 0))
    params = SamplingParams(max_new_tokens=16)
    ids = prompt_ids(tiny.tokenizer, PROMPTS[2])
    base, _ = generate_all(TargetRunner(tiny), ids, params)
    prop = proposer(tiny_dflash)
    spec, _ = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, params, prop, 3)
    assert spec != base


@pytest.mark.speculators
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_speculators_dflash_computes_our_block_logits(tiny, tmp_path, vocab):
    """Our checkpoint in speculators 0.9.0's DFlashDraftModel: the same logits for the same anchored blocks."""
    pytest.importorskip("speculators")
    from speculators import SpeculatorModel
    from speculators.models.dflash import DFlashSpeculatorConfig

    from engine.algos.dflash.io import save_dflash

    counts = torch.arange(tiny.vocab_size).flip(0)
    ours = build_dflash(tiny, aux_layer_ids=[1, 2, 3], num_layers=2, block_size=4, seed=3,
                        draft_vocab_size=160 if vocab == "reduced" else None, token_counts=counts).eval()
    with torch.no_grad():  # non-trivial norms, so a swapped norm would show
        for name, p in ours.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    path = save_dflash(ours, tmp_path / "d", dtype=torch.float32)
    cfg = DFlashSpeculatorConfig.from_pretrained(path)
    cfg.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
    ref = SpeculatorModel.from_pretrained(path, config=cfg).eval()
    with torch.no_grad():  # verifier-owned weights our checkpoint does not carry
        ref.embed_tokens.weight.copy_(tiny.embed_tokens().weight)
        if vocab == "full":
            ref.lm_head.weight.copy_(tiny.lm_head().weight)
    t = 37
    torch.manual_seed(1)
    aux = torch.randn(1, t, ours.fc.in_features)
    ids = torch.randint(3, tiny.vocab_size, (1, t))
    loss_mask = torch.ones(1, t, dtype=torch.long)
    doc = torch.zeros(1, t, dtype=torch.long)
    last = torch.randn(1, t, tiny.hidden_size)
    with torch.no_grad():
        _, theirs, _, _, indices = ref._backbone_forward(hidden_states=aux, input_ids=ids, loss_mask=loss_mask,
                                                         verifier_last_hidden_states=last, document_ids=doc,
                                                         max_anchors=6)
        anchors = indices.view(-1, 4)[:, 0]
        mine = ours.anchored_blocks(aux, ids, torch.arange(t)[None], doc, anchors)
    assert theirs.view(-1, 4, theirs.shape[-1]).shape == mine.shape
    assert (theirs.view_as(mine) - mine).abs().max() <= 1e-4
