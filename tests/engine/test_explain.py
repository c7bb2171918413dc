"""engine.generate.explain: profiles of step events and the plain verdict of a speculative answer."""

from __future__ import annotations

from engine.generate.events import StepEvent
from engine.generate.explain import explain, profile


def _events(steps: int, tokens_per_step: int, step_s: float, draft_s: float = 0.0, drafted: int = 0):
    out = [StepEvent(step=0, tokens=[1], sources=["target"], step_s=0.5, target_s=0.5)]
    for i in range(1, steps + 1):
        out.append(StepEvent(step=i, tokens=[1] * tokens_per_step, sources=["accepted"] * tokens_per_step,
                             drafted=drafted, accepted=tokens_per_step - 1 if drafted else 0, step_s=step_s,
                             draft_s=draft_s, target_s=step_s - draft_s - 0.001))
    return out


def test_profile_sums_decode_steps_and_splits_the_time():
    p = profile(_events(10, 2, 0.02, draft_s=0.005, drafted=3))
    assert (p.steps, p.tokens) == (10, 20) and abs(p.decode_s - 0.2) < 1e-9 and abs(p.draft_s - 0.05) < 1e-9
    assert abs(p.rest_s - 0.01) < 1e-9 and p.mean_acceptance_length == 2.0
    assert p.per_position_acceptance == [1.0, 0.0, 0.0]


def test_explain_says_why_a_draft_loses_and_names_the_better_proposer():
    profiles = {"baseline": profile(_events(60, 1, 0.01)),
                "draft": profile(_events(40, 1, 0.019, draft_s=0.006, drafted=3)),   # 1.5-ish tokens, 1.9 steps
                "ngram": profile(_events(20, 3, 0.013, draft_s=0.0001, drafted=3))}
    rows = explain(profiles, k=3, cost_curve={1: 1.0, 4: 1.3}, labels={"draft": "this draft", "ngram": "n-gram"})
    draft, ngram = rows["draft"], rows["ngram"]
    assert abs(draft["step_cost"] - 1.9) < 1e-6 and draft["speedup"] < 1 <= ngram["speedup"]
    assert "this draft emits 1.0 tokens per step; a step costs 1.9 baseline steps" in draft["sentence"]
    assert "speculation loses" in draft["sentence"] and "n-gram emits 3.0 here" in draft["sentence"]
    assert "faster" in ngram["sentence"] and not ngram["short"]
    assert abs(ngram["ceiling"] - 3.0 / 1.3) < 1e-6


def test_short_answers_are_marked_rough():
    rows = explain({"baseline": profile(_events(5, 1, 0.01)), "ngram": profile(_events(2, 3, 0.012, drafted=3))},
                   k=3)
    assert rows["ngram"]["short"] and "rough indication" in rows["ngram"]["sentence"]
    assert rows["ngram"]["ceiling"] is None  # no cost curve given


def test_steps_without_drafts_are_named_when_they_lower_the_rate():
    events = _events(10, 3, 0.012, drafted=3) + [StepEvent(step=11 + i, tokens=[1], sources=["target"],
                                                           step_s=0.01, target_s=0.009) for i in range(10)]
    rows = explain({"baseline": profile(_events(30, 1, 0.01)), "ngram": profile(events)}, k=3)
    assert "emits 2.0 tokens per step (mean acceptance length 3.00 on the steps it drafted)" in \
        rows["ngram"]["sentence"]


def test_the_ceiling_counts_every_step_not_only_the_drafted_ones():
    """Issue 65: n-gram drafted on 2 steps of 20 (acceptance length 3 there); undrafted steps emit 1 token at cost 1."""
    events = _events(2, 3, 0.012, drafted=3) + [StepEvent(step=3 + i, tokens=[1], sources=["target"],
                                                          step_s=0.01, target_s=0.009) for i in range(18)]
    rows = explain({"baseline": profile(_events(30, 1, 0.01)), "ngram": profile(events)}, k=3,
                   cost_curve={1: 1.0, 4: 1.25})
    ngram = rows["ngram"]
    assert ngram["mean_acceptance_length"] == 3.0 and abs(ngram["tokens_per_step"] - 1.2) < 1e-9
    assert abs(ngram["ceiling"] - 24 / (2 * 1.25 + 18)) < 1e-9   # not 3.0 / 1.25 = 2.4
    assert ngram["ceiling"] < 1.2


def test_a_verification_dearer_than_its_tokens_is_the_reason_given():
    rows = explain({"baseline": profile(_events(60, 1, 0.01)),
                    "draft": profile(_events(40, 1, 0.02, draft_s=0.002, drafted=3))}, k=3)
    assert "verifying a step alone costs 1.7 baseline steps, more than the 1.0 tokens it yields" in \
        rows["draft"]["sentence"]
