"""The decoding walk: the steps greedy speculative decoding takes over a draft's per-state acceptance counts."""

# For greedy decoding of a held-out sequence that is the target's own greedy answer, speculative decoding
# reproduces it token by token. The draft's algorithm computes a(q) for every state "token q is the last
# committed one" (`DraftAlgorithm.acceptance_counts`); the walk q0 = prompt end, q_{i+1} = q_i + a(q_i) + 1
# gives the exact steps decoding takes, and from them vLLM's metrics (mean acceptance length with the bonus
# token, per-position acceptance) for every k <= K at once, since a_k(q) = min(a_K(q), k). Evaluation
# (`engine.measure.evaluate`) and training's validation (`walk_sums`) both walk with this module.

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class HeldOutSample:
    """A prompt and the target's greedy answer: tokens [T], the target's states at the draft's layers [T, A*H]."""

    token_ids: torch.Tensor
    aux: torch.Tensor
    prompt_len: int          # index of the first generated token (the prefill's output)
    end: int                 # index of the last generated token (inclusive)
    id: str = ""
    target_logits: torch.Tensor | None = None  # [T, V], only for the sampled-decoding expectation


@dataclass
class Walk:
    """The steps greedy speculative decoding takes on one sample: drafts verified and accepted per step."""

    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)     # the k the step asked for (min(k, tokens left - 1))
    by_ngram: list[bool] = field(default_factory=list)  # draft_ngram: the n-gram proposed the step, not the draft


def walk(a: Sequence[int], sample: HeldOutSample, k: int, max_new_tokens: int | None = None,
         cuts: Sequence[int] | None = None, by_ngram: Sequence[bool] | None = None) -> Walk:
    """The draft-verify walk of the decode engine (`engine.generate.speculative`) over the counts `a`.

    Each step drafts min(k, remaining - 1) tokens (it never drafts past max_new_tokens; with `cuts`, never more
    than cuts[q], the proposer's own limit at that state), accepts the leading drafts that match (never past the
    sample's end) and commits them plus the target's own token."""
    p, e = sample.prompt_len, sample.end
    limit = max_new_tokens or (1 << 30)  # no limit given: the answer ended by itself (EOS)
    e = min(e, p + limit - 1)  # generation stops after max_new_tokens tokens
    out = Walk()
    q = p
    while q < e:
        remaining = limit - (q - p + 1)
        asked = max(0, min(k, remaining - 1))
        drafted = min(asked, int(cuts[q])) if cuts is not None else asked
        n = min(int(a[q]), drafted, e - q)
        out.drafted.append(drafted)
        out.accepted.append(n)
        out.asked.append(asked)
        out.by_ngram.append(bool(by_ngram[q]) if by_ngram is not None else False)
        q += n + 1
    return out


# Buckets of the answer position where a draft starts (0 = the first token after the prefill's), open at the end.
POSITION_BUCKETS = (0, 1, 4, 16, 64, 256)


def bucket_of(offset: int) -> int:
    """The index of the POSITION_BUCKETS bucket an answer position falls in."""
    return sum(1 for start in POSITION_BUCKETS[1:] if offset >= start)


def bucket_label(bucket: dict[str, Any]) -> str:
    """"4–15" for a `by_answer_position` bucket (its last position inclusive), "256–" for the open one."""
    return f"{bucket['start']}–{'' if bucket['end'] is None else bucket['end'] - 1}"


@dataclass
class Acceptance:
    """vLLM's definitions over walks: a draft = a step that verified at least one draft token."""

    k: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    positions: int = 0                 # answer positions (all-positions average)
    positions_accepted: int = 0
    per_sample: list[float | None] = field(default_factory=list)
    per_sample_drafts: list[int] = field(default_factory=list)  # drafting steps per sample (its weight in the mean)
    expected_steps: int = 0            # sampled decoding: drafting steps of the walk and their expectations
    expected_accepted: float = 0.0
    expected_per_pos: list[float] = field(default_factory=list)
    # per POSITION_BUCKETS bucket: drafts started there and their accepted tokens
    bucket_drafts: list[int] = field(default_factory=lambda: [0] * len(POSITION_BUCKETS))
    bucket_accepted: list[int] = field(default_factory=lambda: [0] * len(POSITION_BUCKETS))
    first_at_starts: int = 0           # drafting steps whose first draft token was accepted
    first_anywhere: int = 0            # answer positions where it would have been (teacher-forced, k >= 1)
    # every step (drafting or not) by its shape (drafted, draft tokens computed, by the n-gram): what it costs
    shapes: dict[tuple[int, int, bool], int] = field(default_factory=dict)
    committed: int = 0                 # tokens the walks' steps committed

    def add_expectation(self, w: Walk, states: list[int], chances: torch.Tensor) -> None:
        """chances [T, K]: P(drafts 1..j+1 accepted) at each state; summed over the walk's drafting steps."""
        for q, d in zip(states, w.drafted, strict=True):
            if d < 1:
                continue
            row = chances[q, :d].tolist()
            self.expected_steps += 1
            self.expected_accepted += sum(row)
            while len(self.expected_per_pos) < d:
                self.expected_per_pos.append(0.0)
            for i, c in enumerate(row):
                self.expected_per_pos[i] += c

    def add(self, w: Walk, all_positions: list[int]) -> None:
        """One walk; `all_positions[i]`: the accepted count had a draft started at answer position i."""
        drafts = accepted = offset = 0
        for i, (d, n) in enumerate(zip(w.drafted, w.accepted, strict=True)):
            start, offset = offset, offset + n + 1  # the answer position this step starts from
            self._shape(w, i, d)
            self.committed += n + 1
            if d < 1:
                continue
            drafts += 1
            accepted += n
            b = bucket_of(start)
            self.bucket_drafts[b] += 1
            self.bucket_accepted[b] += n
            self.first_at_starts += n > 0
            self.num_draft_tokens += d
            while len(self.accepted_per_pos) < d:
                self.accepted_per_pos.append(0)
            for i in range(n):
                self.accepted_per_pos[i] += 1
        self.num_drafts += drafts
        self.num_accepted += accepted
        self.per_sample.append(1.0 + accepted / drafts if drafts else None)
        self.per_sample_drafts.append(drafts)
        self.positions += len(all_positions)
        self.positions_accepted += sum(all_positions)
        self.first_anywhere += sum(1 for x in all_positions if x > 0)

    def _shape(self, w: Walk, i: int, d: int) -> None:
        """Count step i by its cost's shape: a chain cut short computed one draft token past those it sent."""
        asked = w.asked[i] if i < len(w.asked) else d
        ngram = bool(w.by_ngram[i]) if i < len(w.by_ngram) else False
        computed = 0 if ngram else (d if d >= asked else d + 1)
        key = (d, computed, ngram)
        self.shapes[key] = self.shapes.get(key, 0) + 1

    def by_answer_position(self) -> list[dict[str, Any]]:
        """Per bucket of the answer position a draft starts at: start, end (None: open), drafts, mean acceptance
        length."""
        ends = (*POSITION_BUCKETS[1:], None)
        return [{"start": s, "end": e, "num_drafts": d, "mean_acceptance_length": 1.0 + a / d if d else None}
                for s, e, d, a in zip(POSITION_BUCKETS, ends, self.bucket_drafts, self.bucket_accepted, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        d = self.num_drafts
        return {
            "k": self.k, "num_drafts": d, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted,
            "mean_acceptance_length": 1.0 + self.num_accepted / d if d else None,
            "per_position_acceptance": [n / d for n in self.accepted_per_pos] if d else [],
            "all_positions_acceptance_length": 1.0 + self.positions_accepted / self.positions
            if self.positions else None,
            "per_sample_acceptance_length": self.per_sample,
            "per_sample_num_drafts": self.per_sample_drafts,
            "tokens_per_step": self.committed / sum(self.shapes.values()) if self.shapes else None,
            "step_shapes": [[d, c, g, n] for (d, c, g), n in sorted(self.shapes.items())],
            "by_answer_position": self.by_answer_position(),
            # the first-position gap: the first draft token's acceptance where decoding starts drafts, against
            # every answer position (what a teacher-forced step-0 accuracy measures)
            "first_token_acceptance_at_draft_starts": self.first_at_starts / d if d else None,
            "first_token_acceptance_all_positions": self.first_anywhere / self.positions if self.positions else None,
            **({"expected_mean_acceptance_length": 1.0 + self.expected_accepted / self.expected_steps,
                "expected_per_position_acceptance": [c / self.expected_steps for c in self.expected_per_pos]}
               if self.expected_steps else {}),
        }


def walk_states(w: Walk, sample: HeldOutSample) -> list[int]:
    """The index of the last committed token at the start of each step of a walk."""
    states, q = [], sample.prompt_len
    for n in w.accepted:
        states.append(q)
        q += n + 1
    return states


def held_out_sample(token_ids, aux, loss_mask, max_new_tokens, sid) -> HeldOutSample | None:
    """The prompt ends where the first assistant (loss) span starts; the answer is that span (cut at
    max_new_tokens). None when the sample has no such span after a prompt."""
    mask = loss_mask.bool()
    if not bool(mask.any()):
        return None
    p = int(mask.nonzero()[0])
    if p < 1:
        return None
    e = p
    while e + 1 < mask.numel() and bool(mask[e + 1]):
        e += 1
    if max_new_tokens:
        e = min(e, p + max_new_tokens - 1)
    return HeldOutSample(token_ids.long(), aux.float(), p, e, sid)


# -- inside training: the same walk on the validation samples --------------------------------------------------


def walk_sums(algorithm, draft, samples: Iterable[dict[str, torch.Tensor]], aux_columns: Sequence[int],
              ks: Sequence[int]) -> dict[str, float]:
    """Summable walk counters for training samples (sums all-reduce across ranks); {} if the algorithm has no
    `acceptance_counts`. The samples' answers are their first assistant span, taken as the target's greedy
    output (exact when the data was regenerated greedily by this target)."""
    sums: dict[str, float] = {}
    ks = sorted(set(ks))
    was_training = draft.training
    draft.eval()
    try:
        for s in samples:
            sample = held_out_sample(s["token_ids"], s["hidden_states"][:, list(aux_columns)].flatten(1),
                                     s["loss_mask"], None, "")
            if sample is None:
                continue
            a_big, cuts = algorithm.walk_counts(draft, sample.aux, sample.token_ids, ks[-1])
            a_big, cuts = a_big.tolist(), cuts.tolist() if cuts is not None else None
            for k in ks:
                acc = Acceptance(k)
                a = [min(x, k) for x in a_big]
                acc.add(walk(a, sample, k, cuts=cuts), [min(a[q], k, sample.end - q) for q in range(sample.prompt_len,
                                                                                          sample.end)])
                for name, value in (("drafts", acc.num_drafts), ("accepted", acc.num_accepted),
                                    ("positions", acc.positions), ("positions_accepted", acc.positions_accepted),
                                    ("first_at_starts", acc.first_at_starts),
                                    ("first_anywhere", acc.first_anywhere)):
                    sums[f"walk_{name}_{k}"] = sums.get(f"walk_{name}_{k}", 0.0) + value
    except NotImplementedError:
        return {}
    finally:
        draft.train(was_training)
    return sums


def summarize_walk_sums(sums: dict[str, float], ks: Sequence[int], draft_k: int) -> dict[str, float]:
    """`walk_acceptance_length` at the draft's k, the best k and its value, the all-positions average, and the
    first draft token's acceptance where drafts start against every answer position (the first-position gap)."""
    out: dict[str, float] = {}
    taus = {}
    for k in ks:
        d = sums.get(f"walk_drafts_{k}", 0.0)
        if d:
            taus[k] = 1.0 + sums.get(f"walk_accepted_{k}", 0.0) / d
    if not taus:
        return out
    k0 = draft_k if draft_k in taus else max(taus)
    out["walk_acceptance_length"] = taus[k0]
    best = max(taus, key=taus.get)
    out["walk_best_k"] = float(best)
    out["walk_best_acceptance_length"] = taus[best]
    positions = sums.get(f"walk_positions_{k0}", 0.0)
    if positions:
        out["all_positions_acceptance_length"] = 1.0 + sums.get(f"walk_positions_accepted_{k0}", 0.0) / positions
        out["walk_first_token_acceptance_all_positions"] = sums.get(f"walk_first_anywhere_{k0}", 0.0) / positions
    out["walk_first_token_acceptance_at_draft_starts"] = sums.get(f"walk_first_at_starts_{k0}", 0.0) / \
        sums[f"walk_drafts_{k0}"]
    return out
