"""Decoding-exact acceptance without decoding: one draft pass per held-out sample, then the verify walk.

The walk itself (`engine.generate.acceptance`) gives vLLM's metrics (mean acceptance length with the bonus
token, per-position acceptance) for every k <= K at once. The all-positions average (1 + a(q) over every
answer position, what training-time estimates resemble) is reported beside it, so the gap between the two is
visible, and so is the share of answer tokens the draft vocabulary cannot produce.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.algos.base import leading_confident
from engine.algos.common.batching import layout_for
from engine.algos.loading import draft_algorithm
from engine.algos.shipped import default_draft
from engine.data.prompts.load import load_prompts
from engine.data.prompts.workloads import workload_kind
from engine.data.store.check import SampleProblem, refusal, sample_problem
from engine.data.store.files import HiddenStatesDataset, sample_path
from engine.errors import WorkbenchError
from engine.format.checkpoint import weights_sha256
from engine.generate.acceptance import (
    Acceptance,
    HeldOutSample,
    bucket_label,
    held_out_sample,
    walk,
    walk_states,
)
from engine.generate.kernel_choice import load_decode_target
from engine.generate.ngram import draft_ngram_counts
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate_all
from engine.jobs import reporter, tracked
from engine.measure.llamacpp_costs import (
    CALIBRATION_PROMPTS,
    CALIBRATION_TOKENS,
    forecast_llamacpp,
    llamacpp_step_costs,
)
from engine.measure.options import EvaluateOptions
from engine.measure.spread import acceptance_spread
from engine.measure.step_costs import forecast, measure_step_costs, step_cost_units
from engine.provenance import provenance
from engine.targets.dtypes import dtype_name
from engine.targets.identity import target_for_draft
from engine.targets.resolve import resolve_target

log = logging.getLogger(__name__)
# an `evaluate` job's progress: a first kernel choice, the target's answers take most of it, then the draft pass,
# then the step costs
KERNEL_SPAN, ANSWERS_SPAN, WALK_END = (0.0, 0.05), (0.05, 0.85), 0.95
# its phases, by the names later runs here learn their time from (engine.jobs.learned_seconds)
ANSWERS_PHASE = "the target answers the held-out prompts"
WALK_PHASE = "draft pass over the held-out samples"
COSTS_PHASE = "measuring the step costs on this machine"
LLAMACPP_PHASE = "measuring llama.cpp's step costs on this machine"


def evaluate_samples(algorithm, draft, samples: Iterable[HeldOutSample], ks: Sequence[int],
                     options: EvaluateOptions | None = None, *, progress: bool = False,
                     span: tuple[float, float] | None = None,
                     counts: Callable[[HeldOutSample], tuple[torch.Tensor, torch.Tensor | None]] | None = None
                     ) -> dict[str, Any]:
    """Decoding-exact acceptance of `draft` for each k in `ks` on held-out greedy target outputs (the job's
    progress within `span`); `options` as `evaluate` takes them (default: the whole answers).

    With `temperature` > 0 (samples with `target_logits`), also the expected acceptance of sampled decoding
    (sum of min(p, q) per position, teacher-forced) at the greedy walk's states: labelled an expectation.
    `all_drafts` verifies every drafted token: a proposer's own cut (`walk_counts`) is not applied."""
    o = options or EvaluateOptions(max_new_tokens=0)
    max_new_tokens, keep_walks, temperature, all_drafts = o.max_new_tokens or None, o.walks, o.temperature, \
        o.all_drafts
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
    size = phase_size(len(samples), o.max_new_tokens) if isinstance(samples, Sequence) else None
    for sample in tracked(samples, desc=WALK_PHASE, span=span, unit="sample", enabled=progress, units=size):
        a_big, cuts = ((algorithm.acceptance_counts(draft, sample.aux, sample.token_ids, big), None) if all_drafts
                       else counts(sample) if counts is not None
                       else algorithm.walk_counts(draft, sample.aux, sample.token_ids, big, p_min=o.p_min))
        a_big, cuts, by_ngram = a_big.tolist(), cuts.tolist() if cuts is not None else None, None
        if o.method == "draft_ngram":
            a_big, cuts, by_ngram = draft_ngram_counts(sample.token_ids.tolist(), a_big, cuts, big,
                                                       min_match=o.ngram_min_match)
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
            w = walk(a, sample, k, max_new_tokens, cuts, by_ngram)
            results[k].add(w, [min(a[q], k, e - q) for q in range(p, e)])
            if chances is not None:
                results[k].add_expectation(w, walk_states(w, sample), chances)
            if keep_walks:
                walks[k].append({"id": sample.id, "accepted": w.accepted, "drafted": w.drafted,
                                 **({"by_ngram": w.by_ngram} if by_ngram is not None else {})})
        if vocab is not None:
            answer = sample.token_ids[p + 1: e + 1].long()
            answer_tokens += int(answer.numel())
            out_of_vocab += int((~vocab[answer]).sum())
        n += 1
    seconds = time.perf_counter() - t0
    if not n:
        raise WorkbenchError("no held-out samples to evaluate", hint="give extracted val data or more prompts")
    out = {"num_samples": n, "seconds": seconds, "ks": ks, "by_k": {str(k): results[k].to_dict() for k in ks},
           "temperature": temperature, "all_drafts": all_drafts, "proposer": proposer_settings(o),
           "out_of_draft_vocab_fraction": out_of_vocab / answer_tokens if answer_tokens else None}
    best = max(ks, key=lambda k: results[k].to_dict()["mean_acceptance_length"] or 0.0)
    out["best_k"] = best
    if keep_walks:
        out["walks"] = {str(k): v for k, v in walks.items()}
    return out


P_MIN_GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # the confidence cuts the k advice tries


def p_min_forecast(algorithm, draft, samples: list[HeldOutSample], ks: Sequence[int], o: EvaluateOptions,
                   costs: dict[str, Any]) -> dict[str, Any]:
    """The k advice with a confidence cut: per p_min of P_MIN_GRID the walk (exact) and the forecast's fastest k,
    and the best of them beside the draft without a cut."""
    confidences = algorithm.part("evaluate", "counts_and_confidences")
    unrolled = {id(s): confidences(draft, s.aux, s.token_ids, max(ks)) for s in samples}  # once per sample
    rows = []
    for p_min in P_MIN_GRID:
        def cut(s: HeldOutSample, p_min: float = p_min) -> tuple[torch.Tensor, torch.Tensor]:
            a, conf = unrolled[id(s)]
            return a, leading_confident(conf, p_min)

        walked = evaluate_samples(algorithm, draft, samples, ks, o.model_copy(update={"p_min": p_min}), counts=cut)
        fc = forecast(walked, costs)
        k = fc["fastest_k"]
        acc = walked["by_k"][str(k)]
        rows.append({"p_min": p_min, "k": k, "speedup": fc["by_k"][str(k)]["speedup"],
                     "mean_acceptance_length": acc["mean_acceptance_length"],
                     "tokens_per_step": acc["tokens_per_step"]})
    best = max(rows, key=lambda r: r["speedup"] or 0.0)
    return {"rows": rows, "best": best, "trusted": not costs.get("label")}


def p_min_advice(result: dict[str, Any]) -> str:
    """The confidence cut's advice in words beside the forecast without one ("" when there is none)."""
    fp, fc = result.get("forecast_p_min"), result.get("forecast")
    if not fp or not fc:
        return ""
    best, plain = fp["best"], fc["by_k"][str(fc["fastest_k"])]["speedup"]
    if not best["speedup"] or not plain:
        return ""
    verdict = "pays" if best["speedup"] > plain else "does not pay"
    return (f"a confidence cut {verdict} here: --p-min {best['p_min']:g} at k = {best['k']} forecasts "
            f"{best['speedup']:.2f}× against {plain:.2f}× without one (k = {fc['fastest_k']})")


def proposer_settings(o: EvaluateOptions) -> dict[str, Any]:
    """What the walk drafted with: the method and, where set, its confidence cut and n-gram rule."""
    return {"method": o.method, "p_min": o.p_min or None,
            **({"ngram_min_match": o.ngram_min_match} if o.method == "draft_ngram" else {})}


# -- held-out samples: from extracted files, or from the target run once over held-out prompts ------------------


def samples_from_extracted(folder: str | Path, aux_layer_ids: Sequence[int], *, max_samples: int | None = None,
                           max_new_tokens: int | None = None) -> Iterable[HeldOutSample]:
    """Held-out samples from an `extract` folder (each one `held_out_sample` of a stored sample)."""
    data = HiddenStatesDataset(str(folder))
    layout = layout_for(data.manifest["layer_ids"], int(data.manifest["num_layers"]), list(aux_layer_ids),
                        needs_last=False)
    for i in range(len(data) if max_samples is None else min(len(data), max_samples)):
        s = data[i]
        problem = sample_problem(s, data.manifest.get("vocab_size"))
        if problem:  # an id past the vocabulary would fail deep in the draft, NaN would poison the averages
            raise refusal([SampleProblem(sample_path(folder, data.indices[i]), problem)], len(data),
                          hint="re-run the extraction, or remove the file (`python -m engine check DIR` names "
                               "every bad file)")
        sample = held_out_sample(s["token_ids"], s["hidden_states"][:, layout.aux_columns].flatten(1), s["loss_mask"],
                         max_new_tokens, str(i))
        if sample is not None:
            yield sample


def samples_from_prompts(target, prompts: Sequence[Any], aux_layer_ids: Sequence[int], *, max_new_tokens: int,
                         with_logits: bool = False, progress: bool = False,
                         span: tuple[float, float] | None = None) -> list[HeldOutSample]:
    """Run the target once per held-out prompt: its greedy answer (exactly as `bench`'s baseline decodes it), then
    one forward over prompt + answer for the states at the draft's layers."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        params.eos_token_ids = [target.tokenizer.eos_token_id]
    runner, decoder = TargetRunner(target, list(aux_layer_ids)), TargetRunner(target)
    out = []
    for i, prompt in enumerate(tracked(prompts, desc=ANSWERS_PHASE, span=span, unit="prompt", enabled=progress,
                                       units=phase_size(len(prompts), max_new_tokens))):
        ids = prompt_ids(target.tokenizer, prompt)
        answer, _ = generate_all(decoder, ids, params)
        runner.reset()
        logits, aux = runner.forward(ids + answer, all_logits=with_logits)  # [T or 1, V], [T, A*H]
        tokens = torch.tensor(ids + answer, dtype=torch.long)
        out.append(HeldOutSample(tokens, aux.float(), len(ids), len(ids) + len(answer) - 1, str(i),
                                 target_logits=logits if with_logits else None))
    return out


def held_out_answers(tgt, prompts, aux_ids, max_new_tokens: int, with_logits: bool = False,
                     progress: bool = False, span: tuple[float, float] | None = None) -> list[HeldOutSample]:
    """samples_from_prompts, read from engine.measure.answers when this target already answered these prompts."""
    from engine.measure import answers

    def compute():
        return samples_from_prompts(tgt, prompts, aux_ids, max_new_tokens=max_new_tokens, with_logits=with_logits,
                                    progress=progress, span=span)
    if with_logits:  # [T, V] logits per sample are too large to keep
        return compute()
    return answers.samples(tgt, prompts, aux_ids, max_new_tokens=max_new_tokens, eos_token_ids=_eos(tgt),
                           compute=compute, make=HeldOutSample)


def _eos(tgt) -> list[int]:
    """The target's end-of-sequence token, as the answers' key names it."""
    return [tgt.tokenizer.eos_token_id] if tgt.tokenizer is not None and tgt.tokenizer.eos_token_id is not None else []


def answers_stored(tgt, prompts, aux_ids, max_new_tokens: int, with_logits: bool = False) -> bool:
    """Whether held_out_answers reads these answers from the store, so the target decodes nothing."""
    from engine.measure import answers

    if with_logits:
        return False
    key = answers.answers_key(tgt, prompts, aux_ids, max_new_tokens=max_new_tokens, eos_token_ids=_eos(tgt))
    return answers.entry_path(key).is_file()


def phase_size(items: int, tokens: int | None) -> int:
    """A phase's size, which its time scales with: items × tokens (items alone where the data's answers are)."""
    return items * tokens if tokens else items


def evaluation_plan(o: EvaluateOptions, ks: Sequence[int], sets: Sequence[tuple[int, bool]]) -> list[tuple[str, int]]:
    """The phases an evaluation runs and their sizes: per prompt set (its size, its answers stored) the target's
    answers unless stored and the draft pass, then the forecasts asked for."""
    tokens = o.max_new_tokens or None
    plan = []
    for n, stored in sets:
        plan += ([] if stored else [(ANSWERS_PHASE, phase_size(n, tokens or 128))]) + [(WALK_PHASE,
                                                                                       phase_size(n, tokens))]
    if o.forecast and "in-process" in o.forecast_engines:
        plan.append((COSTS_PHASE, step_cost_units(ks)))
    if o.forecast and "llama.cpp" in o.forecast_engines:
        plan.append((LLAMACPP_PHASE, len(ks) + 1))  # a server per k and the baseline's
    return plan


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
    return "\n".join(lines + position_lines(result) + workload_lines(result))


def position_lines(result: dict[str, Any]) -> list[str]:
    """At the best k: acceptance by the answer position drafts start at, and the first-position gap."""
    acc = result["by_k"].get(str(result.get("best_k")), {})
    buckets = [b for b in acc.get("by_answer_position", []) if b["num_drafts"]]
    if not buckets:
        return []
    lines = ["", f"By answer position (k = {result['best_k']}):", "", "| answer positions | drafts | mean acceptance "
             "length |", "|---|---|---|"]
    lines += [f"| {bucket_label(b)} | {b['num_drafts']} | {b['mean_acceptance_length']:.3f} |" for b in buckets]
    starts, anywhere = acc["first_token_acceptance_at_draft_starts"], acc["first_token_acceptance_all_positions"]
    if starts is not None and anywhere is not None:
        lines += ["", f"First draft token accepted: {starts:.3f} where drafts start, {anywhere:.3f} over every "
                      "answer position (teacher-forced)."]
    return lines


def workload_row(spec: str, prompts: int, result: dict[str, Any]) -> dict[str, Any]:
    """One prompt set's acceptance per k, each with its spread over prompts (engine.measure.spread)."""
    return {"workload": spec, "kind": workload_kind(spec), "held_out_prompts": prompts, "best_k": result["best_k"],
            "by_k": {key: acceptance_spread(acc["per_sample_acceptance_length"], acc["per_sample_num_drafts"])
                     for key, acc in result["by_k"].items()}}


def workload_cell(spread: dict[str, Any]) -> str:
    """`1.712 (1.62–1.80)`: the mean acceptance length and its 95% interval over prompts (one prompt: no interval)."""
    tau, ci = spread.get("mean_acceptance_length"), spread.get("ci95")
    if tau is None:
        return "–"
    return f"{tau:.3f} ({ci[0]:.2f}–{ci[1]:.2f})" if ci else f"{tau:.3f} (one prompt)"


def workload_lines(result: dict[str, Any]) -> list[str]:
    """Acceptance per k on each prompt set, with its 95% bootstrap interval over prompts."""
    rows = result.get("by_workload") or []
    if not rows:
        return []
    keys = list(rows[0]["by_k"])
    lines = ["", "Per workload: mean acceptance length (95% interval over prompts):", "",
             "| workload | kind | prompts | " + " | ".join(f"k = {k}" for k in keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for row in rows:
        name = row["workload"] if row["kind"] != "your prompts" else Path(row["workload"]).name
        lines.append(f"| {name} | {row['kind']} | {row['held_out_prompts']} | "
                     + " | ".join(workload_cell(row["by_k"][k]) for k in keys) + " |")
    return lines


def evaluate_draft(options: EvaluateOptions, *, progress: bool = True) -> dict[str, Any]:
    """`python -m engine evaluate` as a function: offline from extracted held-out files (`data`), or online from
    held-out prompts of `dataset` (the target answers each once); with `forecast`, the speedup forecast."""
    o = options
    target, data, temperature, dtype, ks = o.target, o.data, o.temperature, o.dtype, o.k
    max_new_tokens = o.max_new_tokens or None  # 0: the data's whole answers
    draft_path = o.draft or default_draft(target)
    if draft_path is None:
        raise WorkbenchError("no draft given and no shipped draft for this target", hint="pass --draft DIR")
    target = target_for_draft(draft_path, target)  # the draft's verifier, or a target of its shape
    algorithm = draft_algorithm(draft_path)
    tgt = load_decode_target(target, dtype, span=KERNEL_SPAN)  # the dtype decoding runs in: answers, step costs
    model = algorithm.load(draft_path, tgt)
    aux_ids = algorithm.aux_layer_ids(model)
    if ks is None:
        ks = list(range(1, max(5, model.config.speculative_tokens) + 1))
        limit = algorithm.max_k(model.config)
        ks = [k for k in ks if limit is None or k <= limit]
    if data and temperature > 0:
        raise WorkbenchError("--temperature needs the target's logits: evaluate online (--dataset)",
                             hint="drop --data, or evaluate greedy decoding (temperature 0)")
    end = WALK_END if o.forecast else 1.0
    if data:
        samples: Iterable[HeldOutSample] = list(samples_from_extracted(data, aux_ids, max_samples=o.num_prompts,
                                                                       max_new_tokens=max_new_tokens))
        source = {"data": str(data)}
        reporter().plan(evaluation_plan(o, ks, [(len(samples), True)]))
        result = evaluate_samples(algorithm, model, samples, ks, o, progress=progress, span=(ANSWERS_SPAN[0], end))
    else:
        specs = [o.dataset, *dict.fromkeys(w for w in o.workloads or [] if w != o.dataset)]
        # every prompt set read before the target answers any: a bad one is refused before minutes of decoding
        prompt_sets = [load_prompts(spec, o.num_prompts, o.seed, o.max_prompt_chars) for spec in specs]
        reporter().plan(evaluation_plan(o, ks, [(len(p), answers_stored(tgt, p, aux_ids, max_new_tokens or 128,
                                                                         temperature > 0)) for p in prompt_sets]))
        rows = []
        for i, (spec, prompts) in enumerate(zip(specs, prompt_sets, strict=True)):  # answers, then the walk
            lo = ANSWERS_SPAN[0]
            start, stop = lo + (end - lo) * i / len(specs), lo + (end - lo) * (i + 1) / len(specs)
            middle = start + (stop - start) * ANSWERS_SPAN[1]
            these = held_out_answers(tgt, prompts, aux_ids, max_new_tokens or 128, temperature > 0, progress,
                                     span=(start, middle))
            found = evaluate_samples(algorithm, model, these, ks, o, progress=progress, span=(middle, stop))
            rows.append(workload_row(spec, len(prompts), found))
            if i == 0:
                samples, result, source = these, found, {"dataset": o.dataset, "held_out_prompts": len(prompts)}
        if o.workloads:
            result["by_workload"] = rows
    result.update(source, draft=str(draft_path), algorithm=algorithm.name, max_new_tokens=max_new_tokens,
                  draft_k=model.config.speculative_tokens, target_dtype=dtype_name(tgt.dtype),
                  kernel=tgt.extra.get("kernel_summary"), draft_sha256=weights_sha256(draft_path),
                  **provenance(dtype_name(tgt.dtype), on_cpu=tgt.device.type == "cpu"))
    if o.forecast:
        context = list(samples[0].token_ids[: samples[0].prompt_len].tolist()) if isinstance(samples, list) \
            and samples else [1] * 64
        if "in-process" in o.forecast_engines:
            costs_end = 1.0 if "llama.cpp" not in o.forecast_engines else (1.0 + WALK_END) / 2
            reporter().phase(COSTS_PHASE, step_cost_units(ks), span=(WALK_END, costs_end))
            costs = measure_step_costs(tgt, algorithm, model, ks, context=context)
            result["costs"] = costs
            result["forecast"] = forecast(result, costs)
            if algorithm.p_min_cut and not o.p_min and not o.all_drafts and isinstance(samples, list):
                result["forecast_p_min"] = p_min_forecast(algorithm, model, samples, ks, o, costs)
        if "llama.cpp" in o.forecast_engines:
            result.update(_llamacpp_forecast(result, str(draft_path), target, ks, samples, o.gguf_target,
                                             max_new_tokens))
    return result


def _llamacpp_forecast(result: dict[str, Any], draft: str, target: str | None, ks: Sequence[int], samples: Any,
                       gguf_target: str, max_new_tokens: int | None) -> dict[str, Any]:
    """llama.cpp's step costs measured on a few of the held-out prompts (answers of the evaluation's length), and
    its forecast from this acceptance."""
    reporter().phase(LLAMACPP_PHASE, len(ks) + 1)  # the bar stays where the draft pass or the step costs left it
    prompts = [s.token_ids[: s.prompt_len].tolist() for s in list(samples)[:CALIBRATION_PROMPTS]] \
        if isinstance(samples, list) and samples else [[1] * 64]
    costs = llamacpp_step_costs(draft, resolve_target(target).path, ks, prompts, gguf_target=gguf_target,
                                tokens=min(max_new_tokens or CALIBRATION_TOKENS, CALIBRATION_TOKENS))
    return {"costs_llamacpp": costs, "forecast_llamacpp": forecast_llamacpp(result["by_k"], costs)}
