"""Generation engine: greedy losslessness, sampling distribution (chi-square), edge cases, metrics."""

from __future__ import annotations

import pytest
import torch

from engine.algos.eagle3.args import Eagle3Args
from engine.algos.eagle3.io import build_eagle3
from engine.algos.eagle3.proposer import Eagle3Proposer
from engine.errors import WorkbenchError
from engine.generate import speculative
from engine.generate.events import ACCEPTED, BONUS, CORRECTION, TARGET
from engine.generate.metrics import SpecMetrics, measure_cost_curve, speedup_ceiling
from engine.generate.ngram import NgramProposer, ngram_lookup
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams, logits_to_probs
from engine.generate.speculative import generate_all
from testkit.decoding import PROMPTS, OracleProposer, chi_square_pvalue, second_token_distribution


@pytest.fixture(scope="module")
def tiny(tiny_targets):
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["llama"]))


@pytest.fixture(scope="module")
def tiny_draft(tiny):
    counts = torch.arange(tiny.vocab_size).flip(0)  # reduced vocabulary: exercises d2t
    return build_eagle3(tiny, Eagle3Args(draft_vocab_size=160), token_counts=counts, aux_layer_ids=[1, 2, 3])


def run(target, prompt, params, proposer=None, k=3):
    runner = TargetRunner(target, proposer.aux_layer_ids if proposer else None)
    return generate_all(runner, prompt_ids(target.tokenizer, prompt), params, proposer, k, target.tokenizer)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_equals_baseline_on_tiny(tiny, tiny_draft, k):
    params = SamplingParams(max_new_tokens=30, eos_token_ids=[2])
    for text in PROMPTS:
        base, _ = run(tiny, text, params)
        for proposer in (Eagle3Proposer(tiny_draft), NgramProposer(), OracleProposer(tiny)):
            out, events = run(tiny, text, params, proposer, k)
            assert out == base, (proposer.name, text)
            assert all(e.drafted <= k for e in events)


def test_event_sources_and_metrics(tiny):
    params = SamplingParams(max_new_tokens=20)
    _, events = run(tiny, PROMPTS[0], params, OracleProposer(tiny), k=3)
    assert events[0].sources == [TARGET]
    full = [e for e in events[1:] if e.drafted == 3]
    assert full and all(e.sources == [ACCEPTED] * 3 + [BONUS] and not e.rejected for e in full)
    m = SpecMetrics()
    for e in events:
        m.observe(e)
    assert m.num_tokens == 20 and m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert m.per_position_acceptance[0] == 1.0
    # 1 + 3 steps of 4 + a last step that may draft only 2 (never past 20 tokens): drafted per position counts it
    assert m.drafted_per_pos[0] == m.num_drafts and sum(m.drafted_per_pos) == m.num_draft_tokens
    assert m.drafted_per_pos[2] < m.num_drafts and m.accepted_per_pos == m.drafted_per_pos  # all accepted
    twice = SpecMetrics()
    twice.merge(m)
    twice.merge(m)
    assert twice.drafted_per_pos == [2 * d for d in m.drafted_per_pos]
    _, events = run(tiny, PROMPTS[0], params, OracleProposer(tiny, wrong=True), k=3)
    m = SpecMetrics()
    for e in events:
        m.observe(e)
    assert m.num_accepted_tokens == 0 and m.mean_acceptance_length == 1.0
    assert all(e.sources == [CORRECTION] and len(e.rejected) == e.drafted for e in events[1:] if e.drafted)
    assert events[-1].drafted == 0 and events[-1].sources == [TARGET]  # no drafting past max_new_tokens


def test_draft_proposing_eos_stops_like_baseline(tiny):
    params = SamplingParams(max_new_tokens=25, eos_token_ids=[2])
    base, _ = run(tiny, PROMPTS[1], params)
    out, _ = run(tiny, PROMPTS[1], params, OracleProposer(tiny, propose_eos_at=1), k=3)
    assert out == base
    # force EOS to be the target's choice: the output must end at the first EOS, in both modes
    params = SamplingParams(max_new_tokens=25, eos_token_ids=[base[3]])
    base_eos, _ = run(tiny, PROMPTS[1], params)
    out_eos, events = run(tiny, PROMPTS[1], params, OracleProposer(tiny), k=3)
    assert out_eos == base_eos and out_eos[-1] == base[3] and events[-1].finished == "eos"


def test_max_new_tokens_and_stop_strings_honoured(tiny, tiny_draft):
    for n in (1, 2, 7):
        params = SamplingParams(max_new_tokens=n)
        base, _ = run(tiny, PROMPTS[2], params)
        out, _ = run(tiny, PROMPTS[2], params, OracleProposer(tiny), k=5)
        assert len(base) == n and out == base
    base_text = tiny.tokenizer.decode(run(tiny, PROMPTS[3], SamplingParams(max_new_tokens=30))[0])
    stop = base_text[len(base_text) // 2: len(base_text) // 2 + 3]
    params = SamplingParams(max_new_tokens=30, stop=[stop])
    base, bev = run(tiny, PROMPTS[3], params)
    out, sev = run(tiny, PROMPTS[3], params, OracleProposer(tiny), k=4)
    assert out == base and bev[-1].finished == sev[-1].finished == "stop"


def test_prompt_limits_and_empty_prompt(tiny, tiny_draft):
    runner = TargetRunner(tiny)
    with pytest.raises(WorkbenchError, match="empty"):
        list(speculative.generate(runner, [], SamplingParams()))
    with pytest.raises(WorkbenchError, match="empty"):
        prompt_ids(tiny.tokenizer, "   ")
    max_len = tiny.config.max_position_embeddings
    near = [5] * (max_len - 11)
    params = SamplingParams(max_new_tokens=10)
    base, _ = generate_all(runner, near, params)
    prop = Eagle3Proposer(tiny_draft)
    out, _ = generate_all(TargetRunner(tiny, prop.aux_layer_ids), near, params, prop, k=3)
    assert out == base and len(out) == 10
    with pytest.raises(WorkbenchError, match="exceeds"):
        list(speculative.generate(runner, near + [5, 5], params))


def test_ngram_lookup_rule():
    toks = [1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 1, 2, 3, 4]
    assert ngram_lookup(toks, 2, 2, 5) == [9, 1]        # longest suffix 1 2 3 4, earliest occurrence
    assert ngram_lookup([5, 6, 7, 5, 6], 3, 2, 3) == [7, 5, 6]
    assert ngram_lookup([1, 2, 3], 3, 2, 3) == []        # no earlier match
    assert ngram_lookup([4, 4, 4], 3, 1, 1) == [4, 4]    # suffix itself never counts as a match


# -- sampling: the speculative output distribution equals the target's --------------------------------


@pytest.mark.parametrize("broken", [False, True])
def test_sampled_speculation_matches_target_distribution(tiny, tiny_draft, broken, monkeypatch):
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=40)  # step 1 drafts min(k, 3 - 2)
    prompt = prompt_ids(tiny.tokenizer, "hello")
    exact = second_token_distribution(tiny, prompt, params)
    if broken:  # accept every draft: the output then follows the draft, not the target
        monkeypatch.setattr(speculative, "verify_sampled",
                            lambda proposal, logits, p, g: speculative.Verdict(len(proposal.tokens), 0))
    counts = torch.zeros(tiny.vocab_size)
    proposer = Eagle3Proposer(tiny_draft)
    runner = TargetRunner(tiny, proposer.aux_layer_ids)
    draws = 1200
    for seed in range(draws):
        params.seed = seed
        out, events = generate_all(runner, prompt, params, proposer, k=1)
        assert events[1].drafted == 1  # the second token is verified from a draft
        counts[out[1]] += 1
    p = chi_square_pvalue(counts, exact)
    if broken:
        assert p < 1e-6, p
    else:
        assert p > 1e-3, p


def test_top_p_top_k_processing():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert p[2] == 0 and p[3] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert p[0] == 1.0
    full = torch.softmax(logits, 0)
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=float(full[0] + full[1]) + 1e-4))
    assert (p > 0).tolist() == [True, True, True, False]


def test_cost_curve_and_ceiling(tiny):
    curve = measure_cost_curve(TargetRunner(tiny), list(range(3, 40)), [2, 4], repeats=3)
    assert curve[1] == 1.0 and set(curve) == {1, 2, 4} and all(v > 0 for v in curve.values())
    assert speedup_ceiling(25, 10, 10, 1.25) == 2.0 and speedup_ceiling(0, 0, 0, 1.0) is None


def test_inference_drafting_computes_what_training_time_test_trains(tiny, tiny_draft):
    """The proposer's cached forward (step 0 in chunks, then a step on its own hidden) equals the trainer's
    TTT forward: step 0 at every position, and step 1 at the last one (teacher-forced token)."""
    from engine.algos.eagle3.model import DraftCache

    torch.manual_seed(0)
    draft = tiny_draft.float().eval()
    t = 12
    aux = torch.randn(1, t, draft.fc.in_features)              # g_0..g_{t-1}
    ids = torch.randint(3, tiny.vocab_size, (1, t))             # x_1..x_t (ids[:, j] follows g_j)
    positions = torch.arange(1, t + 1).view(1, -1)
    q = t - 2  # training's step 1 at q reads the true token ids[:, q + 1] and step 0's hidden at q
    with torch.inference_mode():
        step0, step1 = draft.ttt_forward(aux, ids, positions, torch.zeros(1, t, dtype=torch.long), steps=2)
        cache = DraftCache()
        hidden = draft.fuse(aux)
        _, first = draft.forward_cached(ids[:, :7], hidden[:, :7], positions[:, :7], cache)  # all 7 rows
        last_h, last = draft.forward_cached(ids[:, 7:q + 1], hidden[:, 7:q + 1], positions[:, 7:q + 1], cache,
                                            last_only=True)
        _, own = draft.forward_cached(ids[:, q + 1:q + 2], last_h, positions[:, q:q + 1] + 1, cache, last_only=True)
    assert last.shape[1] == 1 and cache.length == q + 2
    torch.testing.assert_close(first[0], step0[0, :7], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last[0, 0], step0[0, q], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(own[0, 0], step1[0, q], rtol=1e-4, atol=1e-4)


def test_sessions_generating_at_once_on_one_shared_target_do_not_mix(tiny, tiny_draft):
    """The app serves every browser session from one cached target, each generating in its own thread: the aux
    hidden-state hooks on that shared model must capture only their own thread's forwards (they once collected
    every thread's, and drafting failed with a size mismatch)."""
    import threading

    params = SamplingParams(max_new_tokens=24, eos_token_ids=[2])
    alone = {text: run(tiny, text, params, Eagle3Proposer(tiny_draft))[0] for text in PROMPTS}
    results, errors = {}, []
    start = threading.Barrier(len(PROMPTS))

    def session(text):
        try:
            start.wait()
            for _ in range(3):
                results.setdefault(text, []).append(run(tiny, text, params, Eagle3Proposer(tiny_draft))[0])
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread's prompt
            errors.append((text, repr(exc)))

    threads = [threading.Thread(target=session, args=(text,)) for text in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert {text: outs for text, outs in results.items()} == {text: [alone[text]] * 3 for text in PROMPTS}
