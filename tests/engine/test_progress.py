"""Honest progress: a job's time left comes from this machine's last run of each phase, scaled to its size; a phase
that never ran here says "first run: measuring"; the step costs report progress as they are timed."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from engine import jobs
from engine.measure import evaluate as ev
from engine.measure.options import EvaluateOptions

KIND = "evaluate"
ANSWER_S, STEP_S = 0.05, 0.1  # seconds per answer unit (prompt × token) and per timing of the fake job


def _job(root, name: str, monkeypatch, *, prompts: int, tokens: int, steps: int) -> jobs.Reporter:
    """A job folder under `root` and a fresh reporter writing into it, as `python -m engine` would have."""
    job_dir = root / name
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"kind": KIND, "argv": [KIND], "created": time.time()}))
    monkeypatch.setenv(jobs.JOB_DIR_ENV, str(job_dir))
    monkeypatch.setattr(jobs, "_REPORTER", None)
    rep = jobs.reporter()
    rep.plan([(ev.ANSWERS_PHASE, prompts * tokens), (ev.COSTS_PHASE, steps)])
    return rep


def _work(rep: jobs.Reporter, *, prompts: int, tokens: int, steps: int) -> None:
    """The fake job's work: the answers (time ∝ prompts × tokens), then the step costs timed step by step."""
    rep.phase(ev.ANSWERS_PHASE, prompts * tokens, span=(0.0, 0.9))
    time.sleep(ANSWER_S * prompts * tokens)
    rep.phase(ev.COSTS_PHASE, steps, span=(0.9, 1.0))
    for i in range(steps):
        time.sleep(STEP_S)
        rep.step(i + 1, steps)
    rep.finish("done")


def _left_s(text: str) -> float:
    """The seconds an "about 1 min 05 s left" names."""
    words = text.removeprefix("about ").split(" left")[0].split()
    return sum(float(n) * (60 if unit == "min" else 1) for n, unit in zip(words[::2], words[1::2], strict=True))


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path))
    from ui import jobs as ui_jobs

    ui_jobs._learned.clear()
    ui_jobs._learned_plan.clear()
    return tmp_path


def test_a_second_run_is_estimated_within_30_percent_and_a_first_run_says_so(runs, monkeypatch):
    from ui.jobs import time_left

    size = {"prompts": 2, "tokens": 20, "steps": 20}
    first = _job(runs, "20260101-000000_evaluate", monkeypatch, **size)
    assert time_left(first.status, time.time(), kind=KIND, job_id="20260101-000000_evaluate") == "first run: measuring"
    _work(first, **size)
    second = _job(runs, "20260101-000001_evaluate", monkeypatch, **size)
    started = time.time()
    estimate = _left_s(time_left(second.status, started, kind=KIND, job_id="20260101-000001_evaluate"))
    _work(second, **size)
    took = time.time() - started
    assert abs(estimate - took) <= 0.3 * took, (estimate, took)


def test_estimates_scale_with_each_phases_size_and_name_a_phase_never_run(runs, monkeypatch):
    size = {"prompts": 2, "tokens": 20, "steps": 20}
    _work(_job(runs, "20260101-000000_evaluate", monkeypatch, **size), **size)
    took = {ph["name"]: ph["end"] - ph["start"] for ph in json.loads(
        (runs / "20260101-000000_evaluate" / jobs.STATUS).read_text())["phases"]}
    twice = [(ev.ANSWERS_PHASE, 2 * 20 * 2), (ev.COSTS_PHASE, 20)]  # twice the prompts, the same step costs
    seconds, unknown = jobs.learned_plan(KIND, twice, root=runs)
    assert seconds == pytest.approx(2 * took[ev.ANSWERS_PHASE] + took[ev.COSTS_PHASE]) and unknown == []
    seconds, unknown = jobs.learned_plan(KIND, [*twice, (ev.LLAMACPP_PHASE, 4)], root=runs)
    assert unknown == [ev.LLAMACPP_PHASE]
    assert jobs.learned_plan("bench", twice, root=runs) == (0.0, [ev.ANSWERS_PHASE, ev.COSTS_PHASE])


def test_a_step_reports_its_phase_its_share_of_the_bar_and_its_own_time_left(tmp_path, monkeypatch):
    rep = _job(tmp_path, "20260101-000000_evaluate", monkeypatch, prompts=1, tokens=1, steps=4)
    rep.phase(ev.COSTS_PHASE, 4, span=(0.9, 1.0))
    assert rep.status.plan == [{"name": ev.ANSWERS_PHASE, "units": 1}]  # the phase that came is no longer planned
    time.sleep(0.05)
    rep.step(2, 4)
    status = json.loads((tmp_path / "20260101-000000_evaluate" / jobs.STATUS).read_text())
    assert status["progress"] == pytest.approx(0.95)
    assert status["message"].startswith(f"{ev.COSTS_PHASE}: 2/4 (about ") and "left" in status["message"]


@pytest.fixture
def target_and_draft(tiny_targets, tmp_path):
    from engine.algos.eagle3.args import Eagle3Args
    from engine.algos.eagle3.io import build_eagle3, save_eagle3
    from engine.targets.loading import load_target

    folder = tmp_path / "target"
    shutil.copytree(tiny_targets["llama"], folder)
    target = load_target(str(folder))
    torch.manual_seed(0)
    draft = build_eagle3(target, Eagle3Args(draft_vocab_size=160), token_counts=torch.arange(target.vocab_size).flip(0),
                         aux_layer_ids=[1, 2, 3])
    return folder, save_eagle3(draft, tmp_path / "draft", dtype=torch.float32)


def test_the_step_costs_report_progress_every_few_seconds_of_work(target_and_draft, tmp_path, monkeypatch):
    from engine.cpu import OtherLoad
    from engine.generate import kernel_choice
    from engine.generate.runner import TargetRunner
    from engine.measure import step_costs

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(OtherLoad, "share", lambda self: 0.0)
    forward, measure = TargetRunner.forward, step_costs._step_costs

    def slow(self, ids, **kwargs):  # a slower machine: each forward costs 40 ms per new token, at most 0.2 s
        time.sleep(min(0.2, 0.04 * len(ids)))
        return forward(self, ids, **kwargs)

    def slowly(*args, **kwargs):  # the step costs measured on it
        with monkeypatch.context() as m:
            m.setattr(TargetRunner, "forward", slow)
            return measure(*args, **kwargs)

    monkeypatch.setattr(step_costs, "_step_costs", slowly)
    folder, draft = target_and_draft
    rep = _job(tmp_path, "20260101-000000_evaluate", monkeypatch, prompts=1, tokens=1, steps=1)
    writes = []
    write = rep._write
    monkeypatch.setattr(rep, "_write", lambda: (write(), writes.append((time.time(), rep.status.progress,
                                                                         rep.status.phases[-1]["name"])))[0])
    ev.evaluate_draft(EvaluateOptions(draft=str(draft), target=str(folder), num_prompts=1, max_new_tokens=4,
                                      k=[1, 2, 3], forecast=True), progress=False)
    rep.finish("done")
    costs = [(t, p) for t, p, name in writes if name == ev.COSTS_PHASE]
    times = [t for t, _ in costs]
    assert times[-1] - times[0] >= 3.0, "the measurement was meant to take seconds"
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= 2.0  # never still for long while it works
    assert len({p for _, p in costs}) >= 5 and costs[-1][1] == pytest.approx(1.0)  # the bar moves to the end
    choosing = [p for _, p, name in writes if name == kernel_choice.CHOICE_PHASE]  # the first load chose a path
    assert len(set(choosing)) >= 3 and choosing[-1] == pytest.approx(ev.KERNEL_SPAN[1])


def test_a_phase_without_steps_fills_by_its_last_run_and_a_stopped_servers_serving_teaches_nothing(runs, monkeypatch):
    def serve(name: str, start_s: float) -> jobs.Reporter:
        (runs / name).mkdir()
        (runs / name / "job.json").write_text(json.dumps({"kind": "serve", "argv": ["serve"], "created": time.time()}))
        monkeypatch.setenv(jobs.JOB_DIR_ENV, str(runs / name))
        monkeypatch.setattr(jobs, "_REPORTER", None)
        rep = jobs.reporter()
        rep.phase("starting the server", span=(0.5, 1.0))
        time.sleep(start_s)
        rep.beat("waiting for the server")
        return rep

    first = serve("20260101-000000_serve", 0.3)
    assert 0.5 < first.status.progress < 0.6  # a first start creeps: nothing here says how long it takes
    first.phase("serving")
    first.finish("stopped")
    second = serve("20260101-000001_serve", 0.15)
    assert second.status.phases[-1]["expected_s"] == pytest.approx(0.3, abs=0.1)
    assert second.status.progress == pytest.approx(0.5 + 0.5 * 0.5, abs=0.12)  # half of the last start's time
    assert jobs.learned_seconds("serve", "serving", root=runs) is None  # cut short by the stop: not a measurement
