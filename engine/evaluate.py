"""Decoding-exact acceptance without decoding: per-position draft hits from one draft pass, then the verify walk.

For greedy decoding of a held-out sequence that is the target's own greedy answer, speculative decoding
reproduces it token by token. The draft's algorithm computes a(q) for every state "token q is the last
committed one" (`DraftAlgorithm.acceptance_counts`); the walk q0 = prompt end, q_{i+1} = q_i + a(q_i) + 1
gives the exact steps decoding takes, and from them vLLM's metrics (mean acceptance length with the bonus
token, per-position acceptance) for every k <= K at once, since a_k(q) = min(a_K(q), k).

The all-positions average (1 + a(q) over every answer position, what training-time estimates resemble) is
reported beside it, so the gap between the two is visible, and so is the share of answer tokens the draft
vocabulary cannot produce.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from engine.errors import WorkbenchError

log = logging.getLogger(__name__)


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


def walk(a: Sequence[int], sample: HeldOutSample, k: int, max_new_tokens: int | None = None,
         cuts: Sequence[int] | None = None) -> Walk:
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
        drafted = max(0, min(k, remaining - 1, int(cuts[q]) if cuts is not None else k))
        n = min(int(a[q]), drafted, e - q)
        out.drafted.append(drafted)
        out.accepted.append(n)
        q += n + 1
    return out


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
    expected_steps: int = 0            # sampled decoding: drafting steps of the walk and their expectations
    expected_accepted: float = 0.0
    expected_per_pos: list[float] = field(default_factory=list)

    def add_expectation(self, w: Walk, states: list[int], chances: torch.Tensor) -> None:
        """chances [T, K]: P(drafts 1..j+1 accepted) at each state; summed over the walk's drafting steps."""
        for q, d in zip(states, w.drafted):
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
        drafts = accepted = 0
        for d, n in zip(w.drafted, w.accepted):
            if d < 1:
                continue
            drafts += 1
            accepted += n
            self.num_draft_tokens += d
            while len(self.accepted_per_pos) < d:
                self.accepted_per_pos.append(0)
            for i in range(n):
                self.accepted_per_pos[i] += 1
        self.num_drafts += drafts
        self.num_accepted += accepted
        self.per_sample.append(1.0 + accepted / drafts if drafts else None)
        self.positions += len(all_positions)
        self.positions_accepted += sum(all_positions)

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


def evaluate_samples(algorithm, draft, samples: Iterable[HeldOutSample], ks: Sequence[int], *,
                     max_new_tokens: int | None = None, keep_walks: bool = False, temperature: float = 0.0,
                     progress: bool = False) -> dict[str, Any]:
    """Decoding-exact acceptance of `draft` for each k in `ks` on held-out greedy target outputs.

    With `temperature` > 0 (samples with `target_logits`), also the expected acceptance of sampled decoding
    (sum of min(p, q) per position, teacher-forced) at the greedy walk's states: labelled an expectation."""
    from tqdm import tqdm

    ks = sorted(set(int(k) for k in ks))
    if not ks or ks[0] < 1:
        raise WorkbenchError(f"k must be at least 1, got {ks}", hint="e.g. --k 1,2,3,4,5")
    big = ks[-1]
    limit = algorithm.max_k(draft.config)
    if limit is not None and big > limit:
        raise WorkbenchError(f"this draft proposes at most {limit} tokens per step, not {big}",
                             hint=f"use k <= {limit}")
    results = {k: Acceptance(k) for k in ks}
    vocab = algorithm.draft_vocabulary(draft)
    answer_tokens = out_of_vocab = 0
    walks: dict[int, list[dict]] = {k: [] for k in ks}
    t0 = time.perf_counter()
    n = 0
    for sample in tqdm(samples, desc="evaluate", disable=not progress):
        a_big, cuts = algorithm.walk_counts(draft, sample.aux, sample.token_ids, big)
        a_big, cuts = a_big.tolist(), cuts.tolist() if cuts is not None else None
        chances = None
        if temperature > 0:
            if sample.target_logits is None:
                raise WorkbenchError("the expectation for sampled decoding needs the target's logits",
                                     hint="evaluate online (--dataset) with --temperature")
            chances = algorithm.acceptance_expectation(draft, sample.aux, sample.token_ids, sample.target_logits,
                                                       big, temperature)
        p, e = sample.prompt_len, sample.end
        for k in ks:
            a = [min(x, k) for x in a_big]
            w = walk(a, sample, k, max_new_tokens, cuts)
            results[k].add(w, [min(a[q], k, e - q) for q in range(p, e)])
            if chances is not None:
                results[k].add_expectation(w, walk_states(w, sample), chances)
            if keep_walks:
                walks[k].append({"id": sample.id, "accepted": w.accepted, "drafted": w.drafted})
        if vocab is not None:
            answer = sample.token_ids[p + 1: e + 1].long()
            answer_tokens += int(answer.numel())
            out_of_vocab += int((~vocab[answer]).sum())
        n += 1
    seconds = time.perf_counter() - t0
    if not n:
        raise WorkbenchError("no held-out samples to evaluate", hint="give extracted val data or more prompts")
    out = {"num_samples": n, "seconds": seconds, "ks": ks, "by_k": {str(k): results[k].to_dict() for k in ks},
           "temperature": temperature,
           "out_of_draft_vocab_fraction": out_of_vocab / answer_tokens if answer_tokens else None}
    best = max(ks, key=lambda k: results[k].to_dict()["mean_acceptance_length"] or 0.0)
    out["best_k"] = best
    if keep_walks:
        out["walks"] = {str(k): v for k, v in walks.items()}
    return out


# -- inside training: the same walk on the validation samples ---------------------------------------------------


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
            sample = _sample(s["token_ids"], s["hidden_states"][:, list(aux_columns)].flatten(1), s["loss_mask"],
                             None, "")
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
                                    ("positions", acc.positions), ("positions_accepted", acc.positions_accepted)):
                    sums[f"walk_{name}_{k}"] = sums.get(f"walk_{name}_{k}", 0.0) + value
    except NotImplementedError:
        return {}
    finally:
        draft.train(was_training)
    return sums


def summarize_walk_sums(sums: dict[str, float], ks: Sequence[int], draft_k: int) -> dict[str, float]:
    """`walk_acceptance_length` at the draft's k, the best k and its value, and the all-positions average."""
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
    return out


# -- held-out samples: from extracted files, or from the target run once over held-out prompts ------------------


def samples_from_extracted(folder: str | Path, aux_layer_ids: Sequence[int], *, max_samples: int | None = None,
                           max_new_tokens: int | None = None) -> Iterable[HeldOutSample]:
    """Held-out samples from an `extract` folder: the prompt ends where the first assistant (loss) span starts;
    the answer is that span (cut at max_new_tokens)."""
    from engine.data.store import HiddenStatesDataset
    from engine.train.data import layout_for

    data = HiddenStatesDataset(str(folder))
    layout = layout_for(data.manifest["layer_ids"], int(data.manifest["num_layers"]), list(aux_layer_ids),
                        needs_last=False)
    for i in range(len(data) if max_samples is None else min(len(data), max_samples)):
        s = data[i]
        sample = _sample(s["token_ids"], s["hidden_states"][:, layout.aux_columns].flatten(1), s["loss_mask"],
                         max_new_tokens, str(i))
        if sample is not None:
            yield sample


def _sample(token_ids, aux, loss_mask, max_new_tokens, sid) -> HeldOutSample | None:
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


def samples_from_prompts(target, prompts: Sequence[Any], aux_layer_ids: Sequence[int], *, max_new_tokens: int,
                         with_logits: bool = False, progress: bool = False) -> list[HeldOutSample]:
    """Run the target once per held-out prompt: its greedy answer (exactly as `bench`'s baseline decodes it), then
    one forward over prompt + answer for the states at the draft's layers."""
    from tqdm import tqdm

    from engine.generate.api import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all

    params = SamplingParams(max_new_tokens=max_new_tokens)
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        params.eos_token_ids = [target.tokenizer.eos_token_id]
    runner, decoder = TargetRunner(target, list(aux_layer_ids)), TargetRunner(target)
    out = []
    for i, prompt in enumerate(tqdm(prompts, desc="target answers", disable=not progress)):
        ids = prompt_ids(target.tokenizer, prompt)
        answer, _ = generate_all(decoder, ids, params)
        runner.reset()
        logits, aux = runner.forward(ids + answer, all_logits=with_logits)  # [T or 1, V], [T, A*H]
        tokens = torch.tensor(ids + answer, dtype=torch.long)
        out.append(HeldOutSample(tokens, aux.float(), len(ids), len(ids) + len(answer) - 1, str(i),
                                 target_logits=logits if with_logits else None))
    return out


def _answers(tgt, prompts, aux_ids, max_new_tokens: int, with_logits: bool, progress: bool) -> list[HeldOutSample]:
    """samples_from_prompts, read from engine.measure.answers when this target already answered these prompts."""
    from engine.measure import answers

    def compute():
        return samples_from_prompts(tgt, prompts, aux_ids, max_new_tokens=max_new_tokens, with_logits=with_logits,
                                    progress=progress)
    if with_logits:  # [T, V] logits per sample are too large to keep
        return compute()
    eos = [tgt.tokenizer.eos_token_id] if tgt.tokenizer is not None and tgt.tokenizer.eos_token_id is not None else []
    return answers.samples(tgt, prompts, aux_ids, max_new_tokens=max_new_tokens, eos_token_ids=eos, compute=compute,
                           make=HeldOutSample)


# -- speed: measured cost of a step, and the speedup it implies --------------------------------------------------


def measure_step_costs(target, algorithm, draft, ks: Sequence[int], *, context: Sequence[int],
                       repeats: int = 5) -> dict[str, Any]:
    """On this machine: the target's forward over k+1 tokens and the draft's proposal of k tokens, both in units
    of one single-token target forward (medians over `repeats`)."""
    from engine.generate.metrics import measure_cost_curve
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams

    ks = sorted(set(int(k) for k in ks))
    verify = measure_cost_curve(TargetRunner(target), list(context), [k + 1 for k in ks], repeats=repeats)
    runner = TargetRunner(target, algorithm.aux_layer_ids(draft))
    runner.reset()
    logits, aux = runner.forward(list(context), all_logits=False)  # prefill of the context
    base = runner.length
    one = []
    for _ in range(repeats):  # one single-token target step, measured here too (same context length)
        t = time.perf_counter()
        runner.forward(list(context[-1:]))
        one.append(time.perf_counter() - t)
        runner.crop(base)
    one_s = statistics.median(one)
    first = int(logits[-1].argmax())
    draft_cost: dict[int, float] = {}
    params = SamplingParams()
    for k in ks:
        samples = []
        for _ in range(repeats):
            proposer = algorithm.proposer(draft)
            proposer.start(list(context), aux, first)
            t = time.perf_counter()
            proposer.propose(k, params, None)
            samples.append(time.perf_counter() - t)
        draft_cost[k] = statistics.median(samples) / one_s
    return {"verify_cost": {k: verify[k + 1] for k in ks}, "draft_cost": draft_cost,
            "target_step_ms": one_s * 1e3, "context_tokens": len(context)}


def forecast(result: dict[str, Any], costs: dict[str, Any]) -> dict[str, Any]:
    """Speedup for each k = tokens per step / (verification + drafting), in single-token target steps.

    A baseline step commits one token at cost 1; a speculative step commits the mean acceptance length at cost
    v(k+1) + c_draft(k) (the rest of the loop is ignored)."""
    rows = {}
    for key, acc in result["by_k"].items():
        k = int(key)
        tau = acc["mean_acceptance_length"]
        v, c = costs["verify_cost"].get(k), costs["draft_cost"].get(k)
        rows[key] = {"mean_acceptance_length": tau, "verify_cost": v, "draft_cost": c,
                     "step_cost": (v + c) if v is not None and c is not None else None,
                     "speedup": tau / (v + c) if tau and v is not None and c is not None else None}
    best = max(rows, key=lambda key: rows[key]["speedup"] or 0.0)
    return {"by_k": rows, "recommended_k": int(best), "target_step_ms": costs["target_step_ms"]}


def format_table(result: dict[str, Any], fc: dict[str, Any] | None = None) -> str:
    """A markdown table: k, decoding-exact acceptance, per position, all-positions average, forecast speedup."""
    head = "| k | mean acceptance length (walk) | per-position acceptance | all-positions average |"
    sep = "|---|---|---|---|"
    if fc:
        head += " step cost (target steps) | forecast speedup |"
        sep += "---|---|"
    lines = [head, sep]
    for key, acc in result["by_k"].items():
        tau, allp = acc["mean_acceptance_length"], acc["all_positions_acceptance_length"]
        row = (f"| {key} | {tau:.3f} | {', '.join(f'{x:.3f}' for x in acc['per_position_acceptance'])} | "
               f"{allp:.3f} |" if tau is not None else f"| {key} | – | – | – |")
        if fc:
            f = fc["by_k"][key]
            row += (f" {f['step_cost']:.2f} | {f['speedup']:.2f}× |" if f["speedup"] is not None else " – | – |")
        lines.append(row)
    return "\n".join(lines)


def evaluate_draft(*, draft: str | None = None, target: str | None = None, data: str | None = None,
                   dataset: str | None = "sharegpt", num_prompts: int = 20, max_new_tokens: int | None = 128,
                   ks: Sequence[int] | None = None, max_prompt_chars: int = 1500, seed: int = 0,
                   measure_speed: bool = False, keep_walks: bool = False, temperature: float = 0.0,
                   progress: bool = True, dtype: str = "auto") -> dict[str, Any]:
    """`python -m engine evaluate` as a function: offline from extracted held-out files (`data`), or online from
    held-out prompts of `dataset` (the target answers each once); optionally with the speedup forecast."""
    from engine.generate.api import default_draft, draft_algorithm
    from engine.generate.kernel_choice import load_decode_target
    from engine.targets import dtype_name

    draft_path = draft or default_draft(target)
    if draft_path is None:
        raise WorkbenchError("no draft given and no shipped draft for this target", hint="pass --draft DIR")
    algorithm = draft_algorithm(draft_path)
    tgt = load_decode_target(target, dtype)  # the dtype decoding runs in: its answers and step costs
    model = algorithm.load(draft_path, tgt)
    aux_ids = algorithm.aux_layer_ids(model)
    if ks is None:
        ks = list(range(1, max(5, model.config.speculative_tokens) + 1))
        limit = algorithm.max_k(model.config)
        ks = [k for k in ks if limit is None or k <= limit]
    if data and temperature > 0:
        raise WorkbenchError("--temperature needs the target's logits: evaluate online (--dataset)",
                             hint="drop --data, or evaluate greedy decoding (temperature 0)")
    if data:
        samples: Iterable[HeldOutSample] = list(samples_from_extracted(data, aux_ids, max_samples=num_prompts,
                                                                       max_new_tokens=max_new_tokens))
        source = {"data": str(data)}
    else:
        from engine.generate.bench import load_prompts

        prompts = load_prompts(dataset or "sharegpt", num_prompts, seed, max_prompt_chars)
        samples = _answers(tgt, prompts, aux_ids, max_new_tokens or 128, temperature > 0, progress)
        source = {"dataset": dataset, "held_out_prompts": len(prompts)}
    result = evaluate_samples(algorithm, model, samples, ks, max_new_tokens=max_new_tokens, keep_walks=keep_walks,
                              temperature=temperature, progress=progress)
    result.update(source, draft=str(draft_path), algorithm=algorithm.name, max_new_tokens=max_new_tokens,
                  draft_k=model.config.speculative_tokens, target_dtype=dtype_name(tgt.dtype),
                  kernel=tgt.extra.get("kernel_summary"))
    if measure_speed:
        context = list(samples[0].token_ids[: samples[0].prompt_len].tolist()) if isinstance(samples, list) \
            and samples else [1] * 64
        costs = measure_step_costs(tgt, algorithm, model, ks, context=context)
        result["costs"] = costs
        result["forecast"] = forecast(result, costs)
    return result
