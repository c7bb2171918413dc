"""Baseline and speculative generation as one loop: draft, verify, accept; every step yields a StepEvent."""

# Convention: p = target distribution, q = draft distribution. Greedy verification accepts the longest
# prefix equal to the target's argmax and appends the target's token at the first mismatch (the bonus
# token when all match). Sampled verification is lossless rejection sampling (Leviathan et al. 2023,
# arXiv 2211.17192): accept x with min(1, p(x)/q(x)); on rejection resample from norm(max(0, p - q));
# bonus from p. Deterministic drafts (n-gram, greedy drafts) have one-hot q.

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.errors import WorkbenchError
from engine.generate.events import ACCEPTED, BONUS, CORRECTION, TARGET, StepEvent
from engine.generate.proposers import Proposal, Proposer
from engine.generate.runner import TargetRunner, rollback_problem
from engine.generate.sampling import SamplingParams, logits_to_probs, pick, sample


@dataclass
class Verdict:
    accepted: int      # number of draft tokens accepted
    next_token: int    # correction (if a draft was rejected) or bonus token


def verify_greedy(drafts: list[int], logits: torch.Tensor) -> Verdict:
    """drafts [n]; logits [n+1, V] of the target at [last, d_1..d_n]."""
    target_ids = torch.argmax(logits, dim=-1).tolist()  # [n+1]
    n = 0
    while n < len(drafts) and drafts[n] == target_ids[n]:
        n += 1
    return Verdict(n, target_ids[n])


def verify_sampled(proposal: Proposal, logits: torch.Tensor, params: SamplingParams,
                   generator: torch.Generator | None) -> Verdict:
    """Lossless rejection sampling. logits [n+1, V]; proposal.probs [n, V] or None (one-hot drafts)."""
    p = logits_to_probs(logits, params)  # [n+1, V]
    for i, x in enumerate(proposal.tokens):
        q = proposal.probs[i] if proposal.probs is not None else None
        q_x = float(q[x]) if q is not None else 1.0
        r = float(torch.rand((), generator=generator))
        if r < min(1.0, float(p[i, x]) / max(q_x, 1e-20)):
            continue
        if q is None:  # one-hot q: residual = p without x
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = torch.clamp(p[i] - q, min=0.0)
        if float(residual.sum()) <= 1e-12:
            residual = p[i]
        return Verdict(i, sample(residual / residual.sum(), generator))
    return Verdict(len(proposal.tokens), sample(p[-1], generator))


class _Stopper:
    """EOS, stop strings and max tokens, applied token by token so every mode stops at the same place."""

    def __init__(self, params: SamplingParams, tokenizer):
        self.params = params
        self.tokenizer = tokenizer
        self.out: list[int] = []
        self.reason: str | None = None

    def push(self, token: int) -> bool:
        """Add a token; True if generation must stop after it (the token is kept)."""
        self.out.append(token)
        if token in self.params.eos_token_ids:
            self.reason = "eos"
        elif self.params.stop and self.tokenizer is not None and self._hits_stop():
            self.reason = "stop"
        elif len(self.out) >= self.params.max_new_tokens:
            self.reason = "length"
        return self.reason is not None

    def _hits_stop(self) -> bool:
        tail = self.tokenizer.decode(self.out[-16:], skip_special_tokens=False)
        return any(s in tail for s in self.params.stop)

    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.out)


def _check_prompt(prompt_ids: list[int], params: SamplingParams, runner: TargetRunner) -> None:
    if not prompt_ids:
        raise WorkbenchError("the prompt is empty", hint="give at least one token of prompt text")
    params.check()  # fields may have been changed since it was made
    if params.max_new_tokens < 1:
        raise WorkbenchError("max_new_tokens must be at least 1")
    if len(prompt_ids) + params.max_new_tokens + 1 > runner.max_length:
        raise WorkbenchError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
                             f"the target's maximum length {runner.max_length}",
                             hint="shorten the prompt or generate less")


def generate(
    runner: TargetRunner,
    prompt_ids: list[int],
    params: SamplingParams,
    proposer: Proposer | None = None,
    k: int = 3,
    tokenizer=None,
) -> Iterator[StepEvent]:
    """Yield one StepEvent per target forward. `proposer=None` is the baseline (one token per step)."""
    _check_prompt(prompt_ids, params, runner)
    if proposer is not None and k < 1:
        raise WorkbenchError("k (draft tokens per step) must be at least 1")
    if proposer is not None and (problem := rollback_problem(runner.target)):
        raise WorkbenchError(f"speculative decoding would not be lossless here: {problem}",
                             hint="decode without a draft (baseline) on this target; docs/families.md lists "
                                  "the families verified lossless")
    generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    stopper = _Stopper(params, tokenizer)
    runner.reset()
    t0 = time.perf_counter()
    logits, aux = runner.forward(prompt_ids, all_logits=False)  # prefill: [1, V] (last position), [P, A*H]
    target_s = time.perf_counter() - t0
    last = pick(logits[-1], params, generator)
    if proposer is not None:
        proposer.start(list(prompt_ids), aux, last)
    stopper.push(last)
    yield _event(0, [last], [TARGET], [], 0, 0, t0, 0.0, time.perf_counter() - t0, target_s, stopper, tokenizer,
                 step_start=t0)
    step = 0
    while stopper.reason is None:
        step += 1
        if proposer is None:
            tv = time.perf_counter()
            logits, _ = runner.forward([last])
            target_s = time.perf_counter() - tv
            last = pick(logits[-1], params, generator)
            stopper.push(last)
            yield _event(step, [last], [TARGET], [], 0, 0, t0, 0.0, time.perf_counter() - tv, target_s, stopper,
                         tokenizer, step_start=tv)
            continue
        event, last = _speculative_step(runner, proposer, last, params, k, generator, stopper, step, t0, tokenizer)
        yield event


def _speculative_step(runner, proposer, last, params, k, generator, stopper, step, t0, tokenizer):
    td = time.perf_counter()
    # never draft past max_new_tokens: the step emits drafts + 1 target token
    proposal = proposer.propose(max(0, min(k, stopper.remaining() - 1)), params, generator)
    drafts = proposal.tokens
    tv = time.perf_counter()
    start = runner.length
    logits, aux = runner.forward([last] + drafts)  # [n+1, V]
    target_s = time.perf_counter() - tv
    verdict = (verify_greedy(drafts, logits) if params.greedy
               else verify_sampled(proposal, logits, params, generator))
    n = verdict.accepted
    runner.crop(start + 1 + n)  # keep `last` and the accepted drafts; the next token is not in the cache yet
    kept_aux = aux[: n + 1] if aux is not None else None
    proposer.update(drafts[:n], verdict.next_token, kept_aux)
    verify_s = time.perf_counter() - tv
    emitted = drafts[:n] + [verdict.next_token]
    sources = [ACCEPTED] * n + [BONUS if n == len(drafts) and drafts else CORRECTION if drafts else TARGET]
    out_tokens, out_sources = [], []
    for tok, src in zip(emitted, sources, strict=True):
        out_tokens.append(tok)
        out_sources.append(src)
        if stopper.push(tok):
            break
    event = _event(step, out_tokens, out_sources, drafts[n:], len(drafts), n, t0, tv - td, verify_s, target_s,
                   stopper, tokenizer, step_start=td)
    event.withheld, event.confidence = proposal.withheld, list(proposal.confidence or [])
    return event, verdict.next_token


def _event(step, tokens, sources, rejected, drafted, accepted, t0, draft_s, verify_s, target_s, stopper, tokenizer,
           *, step_start):
    now = time.perf_counter()
    return StepEvent(
        step=step, tokens=tokens, sources=sources, rejected=list(rejected), drafted=drafted, accepted=accepted,
        elapsed_s=now - t0, step_s=now - step_start, draft_s=draft_s, verify_s=verify_s, target_s=target_s,
        text=tokenizer.decode(tokens, skip_special_tokens=False) if tokenizer is not None else "",
        finished=stopper.reason,
    )


def generate_all(runner, prompt_ids, params, proposer=None, k=3, tokenizer=None) -> tuple[list[int], list[StepEvent]]:
    """Run to completion; returns (output token ids, events)."""
    events = list(generate(runner, prompt_ids, params, proposer, k, tokenizer))
    return [t for e in events for t in e.tokens], events
