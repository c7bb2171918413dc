"""One speed per k: interleaved rounds, their stopping rule, rounds under load left out, and the interval."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from engine.measure import speed
from engine.measure.bench import markdown_table, run_bench
from engine.measure.options import BenchOptions
from engine.measure.spread import mean_interval

PROMPTS = [{"prompt": "1 2 3 4 5 6 7 8 9 10, the numbers go on and on"},
           {"messages": [{"role": "user", "content": "hello there, how are you"}]}]


@pytest.fixture(scope="module")
def tiny_draft(tiny_llama, tmp_path_factory):
    import torch

    from engine.algos.eagle3.args import Eagle3Args
    from engine.algos.eagle3.io import build_eagle3, save_eagle3

    draft = build_eagle3(tiny_llama, Eagle3Args(draft_vocab_size=128), token_counts=torch.arange(tiny_llama.vocab_size),
                         aux_layer_ids=[1, 2, 3])
    return str(save_eagle3(draft, tmp_path_factory.mktemp("d") / "draft", dtype=torch.float32))


def test_mean_interval_is_students_t_over_rounds():
    out = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3: half-width t(0.975, 2) / sqrt(3)
    assert out["mean"] == 2.0 and out["half_width"] == pytest.approx(4.303 / 3 ** 0.5, rel=1e-4)
    assert out["ci95"] == pytest.approx([2.0 - 2.4843, 2.0 + 2.4843], abs=1e-3)
    assert mean_interval([1.2])["ci95"] is None and mean_interval([])["mean"] is None  # one run has no spread


def test_every_k_in_one_run_with_the_acceptance_bench_measures(tiny_llama, tiny_draft, monkeypatch):
    monkeypatch.setattr(speed.OtherLoad, "share", lambda self: 0.0)  # a quiet machine, whatever else runs
    monkeypatch.setattr(speed, "STEP_FLOOR", 0.0)  # a tiny target's steps are too short for the floor's slack
    options = BenchOptions(methods="baseline,draft,ngram", draft=tiny_draft, k=2, ks="1-3", max_new_tokens=16,
                           tolerance=100.0, max_rounds=6)
    result = speed.speed_per_k(tiny_llama, PROMPTS, options)
    assert [r["k"] for r in result["rows"]] == [1, 2, 3] and result["methods"]["ngram"]["k"] == 2
    # any interval is narrow enough: stops at the fewest rounds that give one
    assert len(result["rounds"]) == result["rounds_kept"] == speed.MIN_ROUNDS
    assert result["stopped"].startswith("every interval within")
    for row in [*result["rows"], result["methods"]["ngram"]]:
        assert row["identical_to_baseline"] and row["spread"]["n"] == speed.MIN_ROUNDS
        lo, hi = row["spread"]["ci95"]
        assert lo <= row["speedup"] <= hi and row["step_cost"] > 0
        key = f"{row['method']} k={row['k']}"  # the mean over rounds of the baseline's time over the method's
        ratios = [r["seconds"]["baseline"] / r["seconds"][key] for r in result["rounds"]]
        assert row["speedup"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-3)
    # the same acceptance as a one-k bench on the same prompts (greedy decoding is the same walk)
    one = run_bench(tiny_llama, PROMPTS, options.model_copy(update={"ks": None, "k": 3}), measure_cost=False,
                    progress=False)["methods"]["draft"]
    at3 = result["rows"][2]
    assert at3["mean_acceptance_length"] == pytest.approx(one["mean_acceptance_length"])
    assert at3["per_position_acceptance"] == pytest.approx(one["per_position_acceptance"])
    # bench's shape at --k: the pages that read a bench read this too, with the interval in the speedup cell
    assert result["methods"]["draft"]["k"] == 2 and "(" in markdown_table(result).split("| draft |")[1]


@pytest.mark.parametrize("draft_seconds, rounds, why", [
    ([8.0, 8.05, 7.95, 8.0], 3, "every interval within"),  # about 1.25x each round: narrow at the fewest rounds
    ([8.0, 8.2, 7.8, 8.0, 8.0], 5, "every interval within"),  # a little wider: two rounds more
    ([8.0, 6.0, 10.0, 8.0, 6.5, 9.5], 6, "max rounds"),  # 1.05x to 1.67x: never within ±0.03, so every round runs
    ([8.0, 6.0, 10.0, 8.0, 8.0, 8.0, 8.0, 8.0], 8, "max rounds"),  # narrowing, but not to ±0.03 within 8
])
def test_the_stop_rule_waits_for_every_interval_to_be_narrow(monkeypatch, draft_seconds, rounds, why):
    """Rounds with known times (the baseline 10 s each): the run stops at the first round whose every speedup
    interval is within ±tolerance (never before MIN_ROUNDS), else at max_rounds."""
    base, draft = speed.Method("baseline", 0, steps=10), speed.Method("draft", 3, steps=8)
    times = iter(draft_seconds)

    def fake_round(methods, encoded, params, first):
        t = next(times)
        base.seconds.append(10.0)
        draft.seconds.append(t)
        return {"seconds": {"baseline": 10.0, "draft k=3": t}, "other_load": 0.0}

    monkeypatch.setattr(speed, "timed_round", fake_round)
    options = BenchOptions(ks="3", tolerance=0.03, max_rounds=min(len(draft_seconds), 8), budget_min=60)
    done, stopped = speed._run_rounds([base, draft], [[1]], None, options)
    assert (len(done), stopped.split(" ±")[0]) == (rounds, why)
    spread = speed._speedups([base, draft], list(range(rounds)))["draft k=3"]
    assert (spread["half_width"] <= 0.03) == (why == "every interval within")


def test_prompts_timed_under_load_are_timed_again_and_loaded_rounds_left_out(tiny_llama, tiny_draft, monkeypatch):
    monkeypatch.setattr(speed, "STEP_FLOOR", 0.0)
    calls = []
    real = speed.decode_one
    monkeypatch.setattr(speed, "decode_one", lambda *a: calls.append(1) or real(*a))
    loads = iter([0.5, 0.0, 0.0, 0.0])  # the first prompt group ran beside other work, then the machine was quiet
    monkeypatch.setattr(speed.OtherLoad, "share", lambda self: next(loads))
    options = BenchOptions(methods="baseline,draft", draft=tiny_draft, ks="1", max_new_tokens=8, tolerance=100.0)
    result = speed.speed_per_k(tiny_llama, PROMPTS[:1], options)
    assert all(r["clean"] for r in result["rounds"]) and result["rounds_kept"] == speed.MIN_ROUNDS
    assert len(calls) == 2 + 2 * (speed.MIN_ROUNDS + 1)  # warm-up, then the first group twice, the others once
    # a machine busy the whole time: each group timed GROUP_ATTEMPTS times, the rounds left out, then labelled
    calls.clear()
    monkeypatch.setattr(speed.OtherLoad, "share", lambda self: 0.9)
    busy = speed.speed_per_k(tiny_llama, PROMPTS[:1], options.model_copy(update={"max_rounds": 2}))
    assert not any(r["clean"] for r in busy["rounds"]) and busy["rounds_kept"] == 2
    assert busy["label"].startswith("under load") and len(calls) == 2 + 2 * 2 * speed.GROUP_ATTEMPTS


def test_the_time_budget_ends_the_rounds(tiny_llama, tiny_draft, monkeypatch):
    monkeypatch.setattr(speed.OtherLoad, "share", lambda self: 0.0)
    options = BenchOptions(methods="baseline,draft", draft=tiny_draft, ks="1,2", max_new_tokens=8, tolerance=1e-9,
                           budget_min=1e-6)
    result = speed.speed_per_k(tiny_llama, PROMPTS[:1], options)
    assert len(result["rounds"]) == 1 and result["stopped"] == "time budget"
    assert result["rows"][0]["spread"]["ci95"] is None  # one round: no interval claimed
    assert "one round" in "\n".join(speed.speed_lines(result))


def test_a_step_cheaper_than_a_baseline_step_marks_the_round():
    base = speed.Method("baseline", 0, seconds=[10.0, 10.0], steps=100)
    fine = speed.Method("draft", 3, seconds=[8.0, 7.0], steps=70)   # 0.114 s per step against 0.1
    odd = speed.Method("ngram", 3, seconds=[6.0, 6.0], steps=70)    # 0.086 s per step: cheaper than one token
    assert speed._implausible([base, fine, odd], 0) == ["ngram k=3"]
    assert speed._implausible([base, fine], 1) == []


def test_other_load_sees_a_busy_process():
    from engine.cpu import OtherLoad

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        gauge = OtherLoad()
        time.sleep(1.5)
        share = gauge.share()
    finally:
        busy.kill()
    if share is None:
        pytest.skip("no /proc/stat counters for this process's CPUs on this OS")
    assert share >= 0.6 / len(gauge._cpus)  # one process spinning: about one core of them


def test_other_load_is_the_machines_busy_time_less_this_process(tmp_path, monkeypatch):
    """The gauge's arithmetic on counters we write: others = the CPUs' busy ticks (idle and I/O wait left out) less
    this process's own seconds, over CPUs x wall time. Another pytest worker cannot move it (it can the test above)."""
    import os

    from engine.cpu import OtherLoad

    hz, cpus = os.sysconf("SC_CLK_TCK"), sorted(os.sched_getaffinity(0))
    stat = tmp_path / "stat"

    def write(busy_ticks: int, idle_ticks: int) -> None:  # user nice system idle iowait irq softirq steal, per CPU
        stat.write_text("cpu 0 0 0 0 0 0 0 0\n" + "".join(f"cpu{c} {busy_ticks} 0 0 {idle_ticks} {idle_ticks} 0 0 0\n"
                                                         for c in cpus))

    own = iter([10.0, 10.0 + 0.5])  # this process: half a second of CPU during the window
    clock = iter([100.0, 102.0])  # two seconds of wall time
    monkeypatch.setattr(OtherLoad, "_STAT", stat)
    monkeypatch.setattr(OtherLoad, "_own_s", staticmethod(lambda: next(own)))
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    write(0, 0)
    gauge = OtherLoad()
    write(int(1.0 * hz), int(5 * hz))  # each CPU one second busy (and long idle, which must not count)
    expected = (1.0 * len(cpus) - 0.5) / (len(cpus) * 2.0)
    assert gauge.share() == pytest.approx(expected, abs=1.5 / hz)


def test_step_costs_under_load_or_below_one_step_are_measured_again_then_labelled(monkeypatch):
    from engine.cpu import OtherLoad
    from engine.measure import step_costs

    seen = []

    def fake(*args, **kwargs):
        seen.append(1)
        return {"verify_cost": {3: 0.54 if len(seen) < 2 else 1.2}, "draft_cost": {3: 0.1}, "target_step_ms": 5.0}

    monkeypatch.setattr(step_costs, "_step_costs", fake)
    monkeypatch.setattr(OtherLoad, "share", lambda self: 0.0)
    costs = step_costs.measure_step_costs(None, None, None, [3], context=[1])
    assert len(seen) == 2 and costs["attempts"] == 2 and "label" not in costs  # the second attempt was plausible
    seen.clear()
    monkeypatch.setattr(step_costs, "_step_costs", lambda *a, **kw: {**fake(), "verify_cost": {3: 0.54}})
    costs = step_costs.measure_step_costs(None, None, None, [3], context=[1])
    assert len(seen) == step_costs.COST_ATTEMPTS and costs["label"].startswith("implausible")
    fc = step_costs.forecast({"by_k": {"3": {"mean_acceptance_length": 1.7}}}, costs)
    assert fc["recommended_k"] is None and fc["label"] == costs["label"]  # 1.7 / 0.64 > 1, yet nothing advised
    monkeypatch.setattr(step_costs, "_step_costs", lambda *a, **kw: {**fake(), "verify_cost": {3: 1.2}})
    monkeypatch.setattr(OtherLoad, "share", lambda self: 0.4)
    assert step_costs.measure_step_costs(None, None, None, [3], context=[1])["label"].startswith("under load")


def test_bench_ks_on_the_command_line_and_its_refusals(tiny_targets, tiny_draft, tmp_path, capsys):
    import json

    from engine.cli import build_parser, main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "speed.json"
    common = ["bench", "--target", str(tiny_targets["llama"]), "--draft", tiny_draft, "--prompts", str(prompts),
              "--max-new-tokens", "8"]
    assert main([*common, "--ks", "1-2", "--max-rounds", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["k"] for r in data["rows"]] == [1, 2] and set(data["methods"]) == {"baseline", "draft", "ngram"}
    assert "| draft | 2 |" in capsys.readouterr().out
    again = vars(build_parser().parse_args(data["command"].split()[3:]))  # the recorded command runs as recorded
    assert again["ks"] == "1-2" and again["methods"] == "baseline,draft,ngram"
    for flags, said in ((["--ks", "1-2", "--backend", "vllm"], "in-process only"),
                        (["--ks", "1", "--methods", "baseline,ngram"], "add draft to --methods"),
                        (["--ks", "1", "--methods", "baseline,draft,hf_assisted"], "not hf_assisted"),
                        (["--ks", "0"], "every k must be at least 1")):
        assert main([*common, *flags]) != 0
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, flags
