"""The offline evaluator: its walk reproduces greedy speculative decoding step by step, for every k at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.algos.eagle3.args import Eagle3Args
from engine.generate.acceptance import HeldOutSample, walk
from engine.measure.evaluate import evaluate_samples, samples_from_prompts
from engine.measure.options import EvaluateOptions

ROOT = Path(__file__).resolve().parents[2]


def _sample(t: int, prompt_len: int) -> HeldOutSample:
    return HeldOutSample(torch.arange(t), torch.zeros(t, 4), prompt_len, t - 1)


def test_walk_follows_the_engine_rules():
    s = _sample(20, 5)  # tokens 5..19 are generated: the first by prefill, then 14 more
    assert walk([3] * 20, s, 3).accepted == [3, 3, 3, 2]  # 4 tokens a step; never accepts past the end
    assert walk([0] * 20, s, 3).accepted == [0] * 14  # one token a step
    capped = walk([3] * 20, s, 3, max_new_tokens=6)  # never drafts past max_new_tokens
    assert capped.drafted == [3, 0] and capped.accepted == [3, 0]  # 1 + 4 + 1 tokens
    w = walk([0, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], s, 2)
    assert w.accepted[:3] == [2, 1, 0]  # q = 5 -> 8 -> 10 -> 11


def test_acceptance_by_answer_position_and_the_first_position_gap():
    """Drafts are bucketed by the answer position they start at, and the first draft token's acceptance where drafts
    start is told apart from its acceptance over every position (a teacher-forced step-0 accuracy)."""
    from engine.generate.acceptance import POSITION_BUCKETS, Acceptance

    s = _sample(40, 5)  # 34 generated tokens after the first: answer positions 0..33
    a = [0] * 40
    for q in (5, 8, 11, 14):  # the walk lands on 5, 8, 11, 14 (3 accepted, 2 at k = 2: then one a step)
        a[q] = 2
    a[6] = a[7] = 2  # right at positions decoding never starts a draft from
    acc = Acceptance(2)
    acc.add(walk(a, s, 2), [min(a[q], 2, s.end - q) for q in range(s.prompt_len, s.end)])
    d = acc.to_dict()
    buckets = d["by_answer_position"]
    assert [b["start"] for b in buckets] == list(POSITION_BUCKETS) and buckets[-1]["end"] is None
    assert buckets[0] == {"start": 0, "end": 1, "num_drafts": 1, "mean_acceptance_length": 3.0}
    assert buckets[1]["num_drafts"] == 1 and buckets[1]["mean_acceptance_length"] == 3.0  # the step from 3
    assert buckets[2]["mean_acceptance_length"] == pytest.approx(1 + 4 / 6)  # from 6 and 9, then 12..15 one a step
    assert sum(b["num_drafts"] for b in buckets) == d["num_drafts"]
    assert d["first_token_acceptance_at_draft_starts"] == pytest.approx(4 / d["num_drafts"])
    assert d["first_token_acceptance_all_positions"] == pytest.approx(6 / 34)


class _CuttingAlgorithm:
    """An algorithm whose drafts would all be right (2 of 2) but whose proposer's cut verifies none of them."""

    def max_k(self, config):
        return None

    def draft_vocabulary(self, draft):
        return None

    def acceptance_counts(self, draft, aux, token_ids, k):
        return torch.full((token_ids.numel(),), k, dtype=torch.long)

    def walk_counts(self, draft, aux, token_ids, k, p_min=None):
        counts = self.acceptance_counts(draft, aux, token_ids, k)
        return torch.zeros_like(counts), torch.zeros_like(counts)


def test_all_drafts_scores_the_drafts_a_proposers_cut_would_not_verify():
    from types import SimpleNamespace

    samples, draft = [_sample(20, 5)], SimpleNamespace(config=None)
    cut = evaluate_samples(_CuttingAlgorithm(), draft, samples, [2])
    every = evaluate_samples(_CuttingAlgorithm(), draft, samples, [2],
                             EvaluateOptions(max_new_tokens=0, all_drafts=True))
    assert cut["by_k"]["2"]["num_drafts"] == 0 and not cut["all_drafts"]
    assert every["all_drafts"] and every["by_k"]["2"]["mean_acceptance_length"] == 3.0  # 14 tokens: 3+3+3+3+2


def _decode(target, runner_cls, proposer, ids, params, k):
    from engine.generate.speculative import generate

    steps, out = [], []
    for event in generate(runner_cls(target, proposer.aux_layer_ids), ids, params, proposer, k):
        out.extend(event.tokens)
        if event.step > 0:
            steps.append((event.drafted, event.accepted))
    return out, steps


def test_evaluated_acceptance_equals_real_decoding_on_the_builtin_target(builtin_target):
    """Held-out prompts, the shipped draft, k = 1, 3 (its default) and 5: the walk's mean acceptance length is within
    0.03 of greedy speculative decoding (fp32), and >= 95% of the steps have the same (drafted, accepted) pair (the
    behaviour suite checks every k of every algorithm exactly, on the tiny target)."""
    from engine.algos.loading import draft_algorithm
    from engine.algos.shipped import default_draft
    from engine.data.prompts.load import load_prompts
    from engine.generate.metrics import SpecMetrics
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams

    path = default_draft("smollm2-135m-instruct")
    algorithm = draft_algorithm(path)
    draft = algorithm.load(path, builtin_target)
    prompts = load_prompts("sharegpt", 4, 0, 600)
    max_new = 40
    samples = samples_from_prompts(builtin_target, prompts, algorithm.aux_layer_ids(draft), max_new_tokens=max_new)
    ks = (1, 3, 5)
    result = evaluate_samples(algorithm, draft, samples, list(ks), EvaluateOptions(max_new_tokens=max_new, walks=True))
    params = SamplingParams(max_new_tokens=max_new, eos_token_ids=[builtin_target.tokenizer.eos_token_id])
    same = total = 0
    for k in ks:
        metrics = SpecMetrics()
        for prompt, sample, walked in zip(prompts, samples, result["walks"][str(k)], strict=True):
            ids = prompt_ids(builtin_target.tokenizer, prompt)
            out, steps = _decode(builtin_target, TargetRunner, algorithm.proposer(draft), ids, params, k)
            assert out == sample.token_ids[len(ids):].tolist()  # lossless: the answer the evaluator used
            pairs = list(zip(walked["drafted"], walked["accepted"], strict=True))
            same += sum(a == b for a, b in zip(pairs, steps, strict=False))  # counted over the longer one
            total += max(len(pairs), len(steps))
            for d, n in steps:
                if d:
                    metrics.num_drafts += 1
                    metrics.num_accepted_tokens += n
        measured = metrics.mean_acceptance_length
        evaluated = result["by_k"][str(k)]["mean_acceptance_length"]
        assert abs(evaluated - measured) <= 0.03, (k, evaluated, measured)
    assert same / total >= 0.95, (same, total)


def test_evaluate_cli_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "eval.json"
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": "Write a haiku about the sea."}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "List three prime numbers."}]}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "engine", "evaluate", "--num-prompts", "2", "--max-new-tokens", "16",
                           "--k", "1-3", "--workloads", f"humaneval,{mine}", "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| k | mean acceptance length (walk)" in proc.stdout
    result = json.loads(out.read_text())
    assert result["ks"] == [1, 2, 3] and set(result["by_k"]) == {"1", "2", "3"}
    from engine.cli import build_parser
    from engine.cpu import cpu_identity
    from engine.provenance import FIELDS

    assert all(result[f] for f in FIELDS)  # command, machine (model and kind), dtype, day, torch: the app says so
    assert {k: result[k] for k in ("cpu", "cpu_kind")} == cpu_identity() and len(result["date"]) == 10
    again = vars(build_parser().parse_args(result["command"].split()[3:]))
    assert again["k"] == [1, 2, 3] and again["num_prompts"] == 2 and again["json_out"] == str(out)
    from engine.format.checkpoint import weights_sha256

    assert result["draft_sha256"] == weights_sha256(result["draft"])  # and which weights
    for acc in result["by_k"].values():
        tau, r = acc["mean_acceptance_length"], acc["per_position_acceptance"]
        assert tau == pytest.approx(1 + sum(r))  # vLLM's identity for a fixed k
        assert sum(b["num_drafts"] for b in acc["by_answer_position"]) == acc["num_drafts"]
    assert "By answer position (k = " in proc.stdout and "where drafts start" in proc.stdout
    rows = result["by_workload"]  # --dataset's prompts first, then each workload: chat, code, the user's file
    assert [(r["workload"], r["kind"], r["held_out_prompts"]) for r in rows] == [
        ("sharegpt", "chat", 2), ("humaneval", "code", 2), (str(mine), "your prompts", 2)]
    for key, acc in result["by_k"].items():  # the first row is the main table's prompts, with its spread
        spread = rows[0]["by_k"][key]
        assert spread["mean_acceptance_length"] == pytest.approx(acc["mean_acceptance_length"])
        lo, hi = spread["ci95"]
        assert lo <= spread["mean_acceptance_length"] <= hi
    assert "| humaneval | code | 2 |" in proc.stdout and "| mine.jsonl | your prompts | 2 |" in proc.stdout
    from engine.measure.evaluate import evaluate_draft

    alone = evaluate_draft(EvaluateOptions(dataset="humaneval", num_prompts=2, max_new_tokens=16, k=[1, 2, 3]),
                           progress=False)  # the code row is what evaluating on HumanEval alone gives
    for key, acc in alone["by_k"].items():
        assert rows[1]["by_k"][key]["mean_acceptance_length"] == pytest.approx(acc["mean_acceptance_length"])


def test_forecast_and_card_section(tmp_path):
    from engine.measure.step_costs import forecast, recommendation
    from engine.recipes.model_card import EVAL_BEGIN, write_evaluation_section

    result = {"by_k": {"1": {"mean_acceptance_length": 1.5, "per_position_acceptance": [0.5],
                             "all_positions_acceptance_length": 1.6},
                       "2": {"mean_acceptance_length": 1.8, "per_position_acceptance": [0.5, 0.3],
                             "all_positions_acceptance_length": 1.9}},
              "num_samples": 3, "dataset": "sharegpt", "held_out_prompts": 3, "max_new_tokens": 32}
    costs = {"verify_cost": {1: 1.1, 2: 1.2}, "draft_cost": {1: 0.1, 2: 0.2}, "target_step_ms": 20.0}
    fc = forecast(result, costs)
    assert fc["by_k"]["1"]["speedup"] == pytest.approx(1.5 / 1.2)
    assert fc["by_k"]["2"]["speedup"] == pytest.approx(1.8 / 1.4)
    assert fc["recommended_k"] == 2 and "recommended k on this machine: 2" in recommendation(fc)
    slow = forecast(result, {**costs, "verify_cost": {1: 1.9, 2: 2.0}})  # every k below 1x: no k is recommended
    assert slow["recommended_k"] is None and slow["fastest_k"] == 2
    assert recommendation(slow).startswith("no speculation") and "n-gram" in recommendation(slow)
    card = tmp_path / "README.md"
    card.write_text("# A draft\n\n### Number of speculative tokens (k)\n\n| k | mean acceptance length | per-position "
                    "acceptance | speedup | identical |\n|---|---|---|---|---|\n| 1 | 1.35 | 0.35 | 0.77× | yes |\n\n"
                    "## Goals not reached, and why\ntext\n")
    write_evaluation_section(card, {**result, "forecast": fc}, [{"k": 2, "speedup": 1.25}])
    first = card.read_text()
    write_evaluation_section(card, {**result, "forecast": fc})  # replaced in place, not appended twice
    text = card.read_text()
    assert text.count(EVAL_BEGIN) == 1 and text.index(EVAL_BEGIN) < text.index("## Goals not reached")
    assert "| 2 | 1.800 | 0.50, 0.30 | 1.900 | 1.29× | – |" in text
    assert "| 1 | 1.500 | 0.50 | 1.600 | 1.25× | 0.77× |" in text  # measured: the card's own k sweep
    assert "on the machine the evaluation ran on." in text  # a record without its CPU names none
    # the recommended k is the best measured one (k = 2 at 1.25× beats k = 1 at 0.77×), the forecast beside it
    assert "Recommended k on the card's CPU: 2 (measured 1.25×, the best of the k sweep; forecast 1.29×, off by " \
        "+0.04; single runs, no spread recorded)" in first
    assert "every measured k is slower than the target alone on the card's CPU (best: k = 1 at 0.77×" in text
    from engine.measure.step_costs import measured_recommendation

    sweep = [{"k": 1, "speedup": 1.2}, {"k": 3, "speedup": 1.1}]
    assert measured_recommendation(sweep, fc).startswith("recommended k on this machine: 1 (measured 1.20×")
    assert "n-gram proposer measured faster" in measured_recommendation(sweep, fc, ngram=1.3)
    assert measured_recommendation([{"k": 2, "speedup": 0.9}], fc).startswith("no speculation")
    assert measured_recommendation([], fc) == recommendation(fc)  # nothing measured: the forecast's advice
    # measured in rounds: the interval is quoted, and a k whose interval reaches the best one's is named
    spread = [{"k": 1, "speedup": 1.20, "spread": {"ci95": [1.15, 1.25]}},
              {"k": 2, "speedup": 1.18, "spread": {"ci95": [1.16, 1.20]}},
              {"k": 3, "speedup": 1.05, "spread": {"ci95": [1.02, 1.08]}}]
    said = measured_recommendation(spread, fc)
    assert said.startswith("recommended k on this machine: 1 (measured 1.20×, 95% interval 1.15–1.25, the best")
    assert "k = 2 within its interval" in said and "3 within" not in said and "single runs" not in said
    # a forecast from step costs measured under load (or below one step) advises nothing
    assert recommendation({**fc, "label": "under load (other processes used 40% of the CPUs)"}).startswith(
        "no advice from this forecast")
    write_evaluation_section(card, {**result, "forecast": fc, "cpu": "Some CPU X", "target_dtype": "bf16",
                                    "date": "2026-12-02"})
    assert "on the machine the evaluation ran on (Some CPU X, bf16 target, 2026-12-02)." in card.read_text()


def test_sampled_expectation_is_a_probability_and_tends_to_the_greedy_walk(tiny_targets):
    from engine.algos import ALGOS
    from engine.algos.eagle3.io import build_eagle3
    from engine.targets.loading import load_target

    target = load_target(str(tiny_targets["llama"]))
    counts = torch.arange(target.vocab_size).flip(0)
    draft = build_eagle3(target, Eagle3Args(draft_vocab_size=160), token_counts=counts, aux_layer_ids=[1, 2, 3]).eval()
    algorithm = ALGOS.get("eagle3")
    prompts = [[{"role": "user", "content": f"Count to {i}."}] for i in (3, 5)]
    samples = samples_from_prompts(target, prompts, [1, 2, 3], max_new_tokens=12, with_logits=True)
    for s in samples:
        a = algorithm.acceptance_counts(draft, s.aux, s.token_ids, 3)
        warm = algorithm.acceptance_expectation(draft, s.aux, s.token_ids, s.target_logits, 3, 1.0)
        assert ((warm >= 0) & (warm <= 1 + 1e-6)).all() and (warm[:, 1:] <= warm[:, :-1] + 1e-6).all()
        cold = algorithm.acceptance_expectation(draft, s.aux, s.token_ids, s.target_logits, 3, 1e-4)
        for q in range(s.prompt_len, s.end - 3):  # near T = 0 both sample the argmax: the greedy hits
            assert [round(float(c)) for c in cold[q]] == [int(int(a[q]) > j) for j in range(3)]
    result = evaluate_samples(algorithm, draft, samples, [1, 3], EvaluateOptions(max_new_tokens=0, temperature=1.0))
    assert 1.0 <= result["by_k"]["3"]["expected_mean_acceptance_length"] <= 4.0


def test_the_cards_teacher_forcing_bullet_ends_with_the_evaluators_first_token_split(tmp_path):
    """The goals' bullet said "we have not measured that split": an evaluation that measured it replaces the ending
    with its figures (in place, once), and one without them leaves the words as they are."""
    from engine.recipes.model_card import EVAL_BEGIN, HARDER, write_evaluation_section

    card = tmp_path / "README.md"
    bullet = f"- **Teacher forcing vs decoding.** Position 0 is accepted 0.42 of the time, {HARDER}; we have not " \
             "measured that split."
    card.write_text(f"# A draft\n\n## Goals not reached, and why\n{bullet}\n")
    by_k = {"3": {"mean_acceptance_length": 1.7, "per_position_acceptance": [0.42, 0.2, 0.1],
                  "all_positions_acceptance_length": 1.8}}
    write_evaluation_section(card, {"by_k": by_k, "draft_k": 3})
    assert "we have not measured that split." in card.read_text() and EVAL_BEGIN in card.read_text()
    by_k["3"].update(first_token_acceptance_at_draft_starts=0.419, first_token_acceptance_all_positions=0.457)
    for _ in range(2):
        write_evaluation_section(card, {"by_k": by_k, "draft_k": 3})
    text = card.read_text()
    assert "not measured" not in text and text.count("The evaluator measured the split") == 1
    assert f"{HARDER}. The evaluator measured the split on its held-out answers (k = 3): the first draft token is " \
           "accepted 0.42 of the time where decoding starts a draft, 0.46 over every answer position " \
           "(teacher-forced)." in text


def test_a_forecast_with_steps_of_several_shapes_costs_each_step_as_it_ran():
    """With a confidence cut or draft_ngram, each step costs v(drafted + 1) plus the draft tokens it computed (none for
    an n-gram step; one past those sent where a chain was cut), against the tokens one step commits."""
    from engine.measure.evaluate import p_min_advice
    from engine.measure.step_costs import forecast

    costs = {"verify_cost": {1: 1.1, 2: 1.2, 3: 1.3}, "draft_cost": {1: 0.1, 2: 0.2, 3: 0.3}, "target_step_ms": 20.0}
    # k = 3: a full chain (3 sent, 3 computed), a cut chain (1 sent, 2 computed), an n-gram step (2 sent), and a step
    # cut before its first token (0 sent, 1 computed: a one-token target step)
    shapes = [[3, 3, False, 2], [1, 2, False, 1], [2, 0, True, 1], [0, 1, False, 1]]
    acc = {"mean_acceptance_length": 2.0, "tokens_per_step": 2.4, "step_shapes": shapes}
    result = {"by_k": {"3": acc}, "proposer": {"method": "draft_ngram", "p_min": 0.5, "ngram_min_match": 3}}
    fc = forecast(result, costs)
    step = (2 * (1.3 + 0.3) + (1.1 + 0.2) + 1.2 + (1.0 + 0.1)) / 5
    assert fc["by_k"]["3"]["step_cost"] == pytest.approx(step)
    assert fc["by_k"]["3"]["speedup"] == pytest.approx(2.4 / step)
    plain = forecast({**result, "proposer": {"method": "draft", "p_min": None}}, costs)  # every step alike
    assert plain["by_k"]["3"]["speedup"] == pytest.approx(2.0 / 1.6)
    untimed = forecast(result, {**costs, "verify_cost": {3: 1.3}, "draft_cost": {3: 0.3}})
    assert untimed["by_k"]["3"]["speedup"] is None  # a shape whose cost was not timed: no figure
    said = p_min_advice({"forecast": plain, "forecast_p_min": {"best": {"p_min": 0.4, "k": 4, "speedup": 1.4}}})
    assert said == "a confidence cut pays here: --p-min 0.4 at k = 4 forecasts 1.40× against 1.25× without one (k = 3)"


def test_p_min_is_refused_where_it_cannot_act(tmp_path):
    """--write-k with a cut is refused before any evaluation; a DFlash draft refuses --p-min with the reason."""
    for argv in (["evaluate", "--p-min", "0.5", "--forecast", "--write-k"],
                 ["generate", "--draft", str(ROOT / "assets" / "drafts" / "smollm2-135m-instruct-dflash"),
                  "--p-min", "0.5", "--max-new-tokens", "4", "Hello"]):
        proc = subprocess.run([sys.executable, "-m", "engine", *argv], capture_output=True, text=True, cwd=ROOT,
                              timeout=600)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert ("vLLM drafts without --p-min" if "--write-k" in argv else "does not take it") in proc.stderr
