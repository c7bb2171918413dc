"""DSpark's own behaviour (what every algorithm shares is in tests/engine/test_algorithm_behaviour.py): the confidence
cut (its prefix rule, events, text kept, sampling without it), decoding = the training path's blocks, sequential
temperature scaling, training with the three-term loss into a checkpoint vLLM 0.33's rules accept, the tensors
speculators 0.9.0 writes, and parity with speculators' DSparkDraftModel."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from engine.algos import ALGOS
from engine.algos.dspark.args import DSparkArgs
from engine.algos.dspark.io import build_dspark, load_dspark, save_dspark
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate_all
from testkit.decoding import PROMPTS  # the decode engine's own prompts

BLOCK = 4


@pytest.fixture(scope="module")
def tiny(tiny_targets):
    """A private copy of the tiny target: DSpark drafts share (and freeze) its embedding."""
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["llama"]))


def _spread_confidence(draft):
    """A random draft's confidence sits at sigmoid(0) = 0.5 everywhere; a wider head makes the cut vary."""
    with torch.no_grad():
        draft.confidence_head.proj.weight.normal_(0.0, 0.5)
        draft.confidence_head.proj.bias.fill_(1.5)
    return draft


@pytest.fixture(scope="module")
def tiny_dspark(tiny):
    counts = torch.arange(tiny.vocab_size).flip(0)  # reduced vocabulary: exercises d2t
    draft = build_dspark(tiny, DSparkArgs(num_layers=2, block_size=BLOCK, draft_vocab_size=160, markov_rank=16),
                         aux_layer_ids=[1, 2, 3], token_counts=counts)
    with torch.no_grad():  # a Markov bias ~ N(0, 1): it changes drafts, and q still overlaps the target's p
        draft.markov_head.markov_w1.weight.normal_(0.0, 0.5)
        draft.markov_head.markov_w2.weight.normal_(0.0, 0.5)
    return _spread_confidence(draft).eval()


def proposer(draft, threshold=0.0, **options):
    return ALGOS.get("dspark").proposer(draft, confidence_threshold=threshold, **options)


def test_the_cut_shortens_some_blocks_and_keeps_the_text(tiny, tiny_dspark):
    """With a cut at 0.5 some blocks are verified shorter than others, and the text is still the target's (the
    behaviour suite, tests/engine/test_algorithm_behaviour.py, runs DSpark with its default cut)."""
    params = SamplingParams(max_new_tokens=24)
    drafted = []
    for text in PROMPTS:
        ids = prompt_ids(tiny.tokenizer, text)
        base, _ = generate_all(TargetRunner(tiny), ids, params)
        prop = proposer(tiny_dspark, 0.5)
        spec, events = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, params, prop, BLOCK)
        assert spec == base
        drafted += [e.drafted for e in events if e.step > 0]
    assert min(drafted) < max(drafted) <= BLOCK  # the cut shortens some blocks and not others


def test_the_cut_keeps_the_prefix_whose_survival_stays_above_the_threshold(tiny, tiny_dspark):
    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    runner = TargetRunner(tiny, tiny_dspark.config.aux_hidden_state_layer_ids)
    logits, aux = runner.forward(ids, all_logits=False)
    first = int(logits[-1].argmax())
    full, cut = proposer(tiny_dspark, 0.0), proposer(tiny_dspark, 0.5)
    for prop in (full, cut):
        prop.start(ids, aux, first)
    drafts = full.propose(BLOCK, SamplingParams(), None).tokens
    kept = cut.propose(BLOCK, SamplingParams(), None).tokens
    survival = full.last_survival
    n = next((i for i, s in enumerate(survival) if s < 0.5), len(survival))
    assert kept == drafts[:n] and cut.last_cut == n
    assert all(a >= b for a, b in itertools.pairwise(survival))  # a product of probabilities only falls


def test_events_say_where_the_cut_fell(tiny, tiny_dspark):
    """Each step's event carries the withheld slots and the survival estimates (the Demo chat's block view)."""
    from ui.chat import block_marks, survival_text

    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = proposer(tiny_dspark, 0.5)
    _, events = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, SamplingParams(max_new_tokens=24), prop,
                             BLOCK)
    steps = [e for e in events if e.step > 0]
    assert any(e.withheld for e in steps)
    for e in steps:
        assert len(e.confidence) == e.drafted + e.withheld
        assert all(v >= 0.5 for v in e.confidence[: e.drafted])
        assert all(v < 0.5 for v in e.confidence[e.drafted:])
        marks = block_marks(e)
        assert marks.count("✓") == e.accepted and marks.count("✂") == e.withheld and len(marks) == len(e.confidence)
        assert ("|" in survival_text(e)) == bool(e.withheld)


def test_proposer_block_equals_the_training_block(tiny, tiny_dspark):
    """The cached decoding path (committed context K/V + one block + the Markov head on its own choices) computes
    the batched training path's block when the data continues with the drafts (teacher forcing = free running)."""
    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = proposer(tiny_dspark)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    logits, aux = runner.forward(ids, all_logits=False)
    first = int(logits[-1].argmax())
    prop.start(ids, aux, first)
    drafted = prop.propose(BLOCK, SamplingParams(), None).tokens
    seq = torch.tensor(ids + [first] + drafted)
    full_aux = torch.cat([aux, torch.zeros(len(seq) - len(ids), aux.shape[1])])  # later features are never read
    block, conf = tiny_dspark(full_aux[None], seq[None], torch.arange(len(seq))[None],
                              torch.zeros(1, len(seq), dtype=torch.long), torch.tensor([len(ids)]))
    assert drafted == tiny_dspark.draft_to_target(block[0].argmax(-1)).tolist()
    survival = torch.cumprod(torch.sigmoid(conf[0]), 0)
    assert torch.allclose(survival, torch.tensor(prop.last_survival), atol=1e-5)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_teacher_forced_heads_equal_the_slot_by_slot_heads(tiny, head):
    """Training computes every slot of every block at once (the rnn head alone loops over slots); that equals the
    decoding path's one slot at a time with the same previous tokens, logits and confidences."""
    draft = build_dspark(tiny, DSparkArgs(num_layers=1, block_size=BLOCK, markov_rank=16, markov_head_type=head,
                                          draft_vocab_size=160),
                         aux_layer_ids=[1, 2, 3], seed=5, token_counts=torch.arange(tiny.vocab_size).flip(0)).eval()
    with torch.no_grad():
        draft.markov_head.markov_w1.weight.normal_(0.0, 1.0)
        torch.manual_seed(2)
        x = torch.randn(6, BLOCK, draft.hidden_size)                       # [N, B, H]
        prev = torch.randint(3, tiny.vocab_size, (6, BLOCK))               # [N, B]
        logits, conf = draft.heads(x, prev)
        hn, state = draft.norm(x), draft.markov_head.initial_state(6, x)
        base = draft.project(hn)
        for k in range(BLOCK):
            u, c, state = draft.slot(k, hn[:, k], base[:, k], prev[:, k], state)
            assert (u - logits[:, k]).abs().max() <= 1e-5 and (c - conf[:, k]).abs().max() <= 1e-5, (head, k)
    assert not torch.equal(logits, base)                                   # the Markov bias is in both


def test_markov_head_changes_the_drafts(tiny, tiny_dspark):
    """The corrected logits differ from the backbone's: the sequential head is on the drafting path."""
    ids = prompt_ids(tiny.tokenizer, PROMPTS[0])
    prop = proposer(tiny_dspark)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    logits, aux = runner.forward(ids, all_logits=False)
    prop.start(ids, aux, int(logits[-1].argmax()))
    with torch.no_grad():
        x = prop.block_hidden()
        base = tiny_dspark.logits(x)[0].argmax(-1)
        tokens, _, _ = tiny_dspark.draft_sequentially(x, torch.tensor([prop.anchor]), BLOCK, lambda u: u.argmax(-1))
    assert not torch.equal(base, tokens[0])


@pytest.mark.slow
@pytest.mark.parametrize("threshold", [0.0])
def test_sampled_drafting_matches_the_target_distribution(tiny, tiny_dspark, threshold):
    """Sampled drafts from the Markov-corrected q, verified by rejection sampling, without the cut (the behaviour
    suite samples with the default cut): the second token's distribution is the target's."""
    from testkit.decoding import chi_square_pvalue, second_token_distribution  # the engine's own checks

    params = SamplingParams(max_new_tokens=4, temperature=1.0, top_k=40)  # step 1 drafts min(k, 4 - 2)
    prompt = prompt_ids(tiny.tokenizer, "hello")
    exact = second_token_distribution(tiny, prompt, params)
    counts = torch.zeros(tiny.vocab_size)
    prop = proposer(tiny_dspark, threshold)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    accepted = 0
    for seed in range(500):
        params.seed = seed
        out, events = generate_all(runner, prompt, params, prop, k=2)
        assert events[1].drafted == 2  # no cut: the second token is the first of a verified block
        counts[out[1]] += 1
        accepted += events[1].accepted
    assert accepted > 0  # drafts were accepted: the accept branch of the rejection sampler ran, not only its residual
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_sampled_acceptance_expectation_is_the_product_of_overlaps(tiny, tiny_dspark):
    """The evaluator's T > 0 hook: entry (q, j) = prod_{i<=j} sum_x min(p_i, q_i), with q_i the teacher-forced
    corrected draft distribution of slot i and p_i the target's at q + i (recomputed here for one state)."""
    algo = ALGOS.get("dspark")
    ids = prompt_ids(tiny.tokenizer, PROMPTS[0])
    ids = ids + generate_all(TargetRunner(tiny), ids, SamplingParams(max_new_tokens=12))[0]
    logits, aux = TargetRunner(tiny, algo.aux_layer_ids(tiny_dspark)).forward(ids)
    tokens = torch.tensor(ids)
    chances = algo.acceptance_expectation(tiny_dspark, aux, tokens, logits, BLOCK, 0.8)      # [T, k]
    q = len(ids) - 8
    with torch.no_grad():
        block, _ = tiny_dspark(aux[None], tokens[None], torch.arange(len(ids))[None],
                               torch.zeros(1, len(ids), dtype=torch.long), torch.tensor([q]))
    vocab_ids = tiny_dspark.draft_to_target(torch.arange(block.shape[-1]))
    alive, expected = 1.0, []
    for j in range(BLOCK):
        q_j = torch.zeros(tiny.vocab_size)
        q_j[vocab_ids] = torch.softmax(block[0, j] / 0.8, -1)
        alive *= float(torch.minimum(torch.softmax(logits[q + j] / 0.8, -1), q_j).sum())
        expected.append(alive)
    assert chances[q].tolist() == pytest.approx(expected, abs=1e-5)
    assert float(chances[:, 0].max()) <= 1.0 and bool((chances[:, 1:] <= chances[:, :-1] + 1e-7).all())


def test_sequential_temperature_scaling_lowers_the_calibration_error():
    from engine.algos.dspark.calibrate import cumulative_ece, fit_temperatures

    torch.manual_seed(0)
    n, b = 4000, 4
    true_logit = torch.randn(n, b) * 1.5 + 1.0
    accept = torch.sigmoid(true_logit)                       # the real per-slot acceptance rates
    conf = true_logit * 3.0                                  # an over-confident head: logits 3x too large
    valid = torch.ones(n, b, dtype=torch.bool)
    temps = fit_temperatures(conf, accept, valid)
    before = cumulative_ece(conf, accept, valid, torch.ones(b))
    after = cumulative_ece(conf, accept, valid, temps)
    assert all(a < 0.5 * x for a, x in zip(after, before, strict=True)), (before, after)
    assert 2.0 <= float(temps[0]) <= 4.5  # slot 0 alone: the fit undoes the factor 3


def test_dspark_trains_calibrates_and_writes_a_checkpoint_vllm_rules_accept(tiny_targets, tmp_path):
    from engine.format import vllm_rules as vr
    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft
    from engine.targets.loading import load_target
    from testkit.training import train_online

    final, val = train_online("dspark", tiny_targets["llama"], tmp_path / "run", epochs=6,
                              num_layers=1, block_size=BLOCK, max_anchors=64, markov_rank=16)
    assert val[-1]["loss"] < val[0]["loss"]
    assert val[-1]["tv"] < val[0]["tv"]  # the TV term is trained
    assert {"full_acc_0", "pos_acc_3", "ce", "conf_bce", "tau_probabilistic", "walk_acceptance_length"} <= set(val[-1])
    calibration = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert len(calibration["temperatures"]) == BLOCK and len(calibration["ece_after"]) == BLOCK
    assert calibration["blocks"] > 0 and {"mean_ece_before", "mean_ece_after"} <= set(calibration)
    report = validate_draft(final)
    assert report.ok, [i.message for i in report.errors]
    config = json.loads((final / "config.json").read_text())
    assert config["confidence_temperatures"] == calibration["temperatures"]
    assert config["speculators_model_type"] == "dspark" and config["sample_from_anchor"] is True
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == BLOCK
    # vLLM 0.33's view of the folder: its DSpark architecture, every slot predicting, and exactly our tensors
    hf = vr.extract_transformers_pre_trained_config(config)
    assert hf["architectures"] == ["Qwen3DSparkModel"] and hf["dspark_bonus_anchor"] is False
    assert hf["markov_rank"] == 16 and hf["target_layer_ids"] == [i - 1 for i in config["aux_hidden_state_layer_ids"]]
    names = tensor_index(final)
    h = load_target(str(tiny_targets["llama"])).hidden_size
    assert tuple(names["markov_head.markov_w1.weight"].shape) == (384, 16)
    assert tuple(names["markov_head.markov_w2.weight"].shape) == (384, 16)
    assert tuple(names["confidence_head.proj.weight"].shape) == (1, h + 16)
    assert not set(names) & {"lm_head.weight", "embed_tokens.weight", "d2t", "t2d"}  # full vocab: shared head
    reloaded = load_dspark(final, load_target(str(tiny_targets["llama"])))
    assert reloaded.confidence_temperature.tolist() == pytest.approx(calibration["temperatures"])


def test_vllm_rules_expect_exactly_our_tensors(tiny, tiny_dspark, tmp_path):
    """Reduced vocabulary: lm_head and d2t present (vLLM requires both), Markov W2 over the draft vocabulary."""
    from engine.format import vllm_rules as vr
    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft

    path = save_dspark(tiny_dspark, tmp_path / "d")
    report = validate_draft(path)
    assert report.ok, [i.message for i in report.errors]
    names = tensor_index(path)
    assert {"lm_head.weight", "d2t", "t2d"} <= set(names)
    assert tuple(names["markov_head.markov_w2.weight"].shape) == (160, 16)
    hf = vr.extract_transformers_pre_trained_config(json.loads((path / "config.json").read_text()))
    assert hf["enable_confidence_head"] is True and hf["draft_vocab_size"] == 160


def test_a_saved_draft_vocabulary_draft_loads_and_drafts_the_same(tiny, tiny_dspark, tmp_path):
    """Reduced vocabulary (own lm_head, no target head buffer): save -> load gives the same weights and drafts."""
    path = save_dspark(tiny_dspark, tmp_path / "d", dtype=torch.float32)
    loaded = ALGOS.get("dspark").load(path, tiny)
    assert loaded.lm_head is not None
    ours, theirs = tiny_dspark.checkpoint_state(), loaded.checkpoint_state()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k].float(), theirs[k].float()) for k in ours)
    ids = prompt_ids(tiny.tokenizer, [{"role": "user", "content": PROMPTS[0]}])
    params = SamplingParams(max_new_tokens=16)
    outs = [generate_all(TargetRunner(tiny, p.aux_layer_ids), ids, params, p, BLOCK)
            for p in (proposer(tiny_dspark, 0.2), proposer(loaded, 0.2))]
    assert outs[0][0] == outs[1][0]
    assert [(e.drafted, e.accepted) for e in outs[0][1]] == [(e.drafted, e.accepted) for e in outs[1][1]]


def test_our_draft_has_the_tensors_speculators_writes(fixtures_dir):
    """A draft built from speculators 0.9.0's Qwen3-8B DSpark config (meta device) holds exactly the tensors its
    state_dict.tsv marks `saved`, with the same shapes."""
    from engine.algos.dspark.model import DSparkDraft
    from speculators_ref import saved_and_built_shapes

    saved, ours = saved_and_built_shapes(fixtures_dir / "dspark_qwen3_8b", DSparkDraft)
    assert ours == saved


@pytest.mark.speculators
@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_speculators_dspark_computes_our_logits_and_confidences(tiny, tmp_path, head):
    """Our checkpoint in speculators 0.9.0's DSparkDraftModel: the same Markov-corrected logits and confidence
    logits for the same anchored blocks (teacher-forced previous tokens)."""
    pytest.importorskip("speculators")
    from speculators.models.dspark import DSparkSpeculatorConfig

    from speculators_ref import load_block_reference

    counts = torch.arange(tiny.vocab_size).flip(0)
    ours = build_dspark(tiny, DSparkArgs(num_layers=2, block_size=BLOCK, markov_rank=16, markov_head_type=head,
                                         draft_vocab_size=160),
                        aux_layer_ids=[1, 2, 3], seed=3, token_counts=counts).eval()
    with torch.no_grad():  # non-trivial norms and a visible Markov bias, so a swapped piece would show
        for name, p in ours.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        ours.markov_head.markov_w1.weight.normal_(0.0, 1.0)
        ours.confidence_head.proj.bias.fill_(0.3)
    path = save_dspark(ours, tmp_path / "d", dtype=torch.float32)
    ref = load_block_reference(path, DSparkSpeculatorConfig, tiny)
    t = 37
    torch.manual_seed(1)
    aux = torch.randn(1, t, ours.fc.in_features)
    ids = torch.randint(3, tiny.vocab_size, (1, t))
    loss_mask = torch.ones(1, t, dtype=torch.long)
    doc = torch.zeros(1, t, dtype=torch.long)
    last = torch.randn(1, t, tiny.hidden_size)
    with torch.no_grad():
        hidden, base, _, _, indices = ref._backbone_forward(hidden_states=aux, input_ids=ids, loss_mask=loss_mask,
                                                            verifier_last_hidden_states=last, document_ids=doc,
                                                            max_anchors=6)
        n = indices.numel() // BLOCK
        prev = ids[0, indices].view(n, BLOCK)
        blocks = hidden.view(n, BLOCK, -1)
        e = ref.markov_head.prev_embeddings(prev)
        theirs = base.view(n, BLOCK, -1) + ref.markov_head.block_bias(prev_token_ids=prev, hidden_states=blocks,
                                                                     prev_emb=e)
        theirs_conf = ref.confidence_head(torch.cat([blocks, e], -1))
        mine, mine_conf = ours(aux, ids, torch.arange(t)[None], doc, indices.view(n, BLOCK)[:, 0])
    assert (theirs - mine).abs().max() <= 1e-4
    assert (theirs_conf - mine_conf).abs().max() <= 1e-4
