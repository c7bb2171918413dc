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
    runner.reset()
    run = _Run(runner, proposer, params, k, tokenizer,
               torch.Generator().manual_seed(params.seed) if params.seed is not None else None)
    logits, aux = runner.forward(prompt_ids, all_logits=False)  # prefill: [1, V] (last position), [P, A*H]
    target_s = time.perf_counter() - run.t0
    last = pick(logits[-1], params, run.generator)
    if proposer is not None:
        proposer.start(list(prompt_ids), aux, last)
    run.stopper.push(last)
    yield run.stamp(StepEvent(0, [last], [TARGET], verify_s=time.perf_counter() - run.t0, target_s=target_s), run.t0)
    step = 0
    while run.stopper.reason is None:
        step += 1
        event, last = run.baseline_step(step, last) if proposer is None else run.speculative_step(step, last)
        yield event


class _Run:
    """One generation's fixed parts (target, proposer, sampling, stop rules), read by every step."""

    def __init__(self, runner: TargetRunner, proposer: Proposer | None, params: SamplingParams, k: int, tokenizer,
                 generator: torch.Generator | None):
        self.runner, self.proposer, self.params, self.k = runner, proposer, params, k
        self.tokenizer, self.generator = tokenizer, generator
        self.stopper = _Stopper(params, tokenizer)
        self.t0 = time.perf_counter()

    def baseline_step(self, step: int, last: int) -> tuple[StepEvent, int]:
        tv = time.perf_counter()
        logits, _ = self.runner.forward([last])  # [1, V]
        target_s = time.perf_counter() - tv
        last = pick(logits[-1], self.params, self.generator)
        self.stopper.push(last)
        return self.stamp(StepEvent(step, [last], [TARGET], verify_s=time.perf_counter() - tv, target_s=target_s),
                          tv), last

    def speculative_step(self, step: int, last: int) -> tuple[StepEvent, int]:
        runner, proposer, stopper = self.runner, self.proposer, self.stopper
        td = time.perf_counter()
        # never draft past max_new_tokens: the step emits drafts + 1 target token
        proposal = proposer.propose(max(0, min(self.k, stopper.remaining() - 1)), self.params, self.generator)
        drafts = proposal.tokens
        tv = time.perf_counter()
        start = runner.length
        logits, aux = runner.forward([last] + drafts)  # [n+1, V]
        target_s = time.perf_counter() - tv
        verdict = (verify_greedy(drafts, logits) if self.params.greedy
                   else verify_sampled(proposal, logits, self.params, self.generator))
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
        event = StepEvent(step, out_tokens, out_sources, rejected=list(drafts[n:]), drafted=len(drafts), accepted=n,
                          draft_s=tv - td, verify_s=verify_s, target_s=target_s, withheld=proposal.withheld,
                          confidence=list(proposal.confidence or []))
        return self.stamp(event, td), verdict.next_token

    def stamp(self, event: StepEvent, step_start: float) -> StepEvent:
        """Fill what is known once the step is done: times since the start and of the step, text, stop reason."""
        now = time.perf_counter()
        event.elapsed_s, event.step_s = now - self.t0, now - step_start
        if self.tokenizer is not None:
            event.text = self.tokenizer.decode(event.tokens, skip_special_tokens=False)
        event.finished = self.stopper.reason
        return event


def generate_all(runner, prompt_ids, params, proposer=None, k=3, tokenizer=None) -> tuple[list[int], list[StepEvent]]:
    """Run to completion; returns (output token ids, events)."""
    events = list(generate(runner, prompt_ids, params, proposer, k, tokenizer))
    return [t for e in events for t in e.tokens], events
