"""Comparisons of real vLLM's speculative counters with our engine's."""

from __future__ import annotations


def assert_accepts_as_ours(theirs: dict, ours: dict, what: str, rel: float = 0.03) -> None:
    """vLLM's accepted tokens per draft within `rel` of ours, plus two tokens over all drafts: a near-tie in the
    draft's fp32 arithmetic may flip a proposal, and the flip also changes how many drafts there are (CI saw 42 in 95
    against 43 in 92). Accepted tokens, not the mean acceptance length: its leading 1 hides most of a difference."""
    assert ours["num_accepted_tokens"] > 0, f"{what}: our engine accepted nothing, so nothing is compared"
    v = theirs["num_accepted_tokens"] / theirs["num_drafts"]
    o = ours["num_accepted_tokens"] / ours["num_drafts"]
    print(f"\n{what}: accepted tokens per draft vLLM {v:.4f} ({theirs['num_accepted_tokens']} in "
          f"{theirs['num_drafts']}), ours {o:.4f} ({ours['num_accepted_tokens']} in {ours['num_drafts']})")
    assert abs(v - o) <= rel * o + 2 / ours["num_drafts"], (what, v, o)
