"""The start page, one source per speed figure, and progress with time estimates (AppTest; fast)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from engine import jobs
from testkit.app import ok, open_app, research_checkpoint, texts

BUILTIN = "smollm2-135m-instruct"


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setenv("WORKBENCH_RUNS", str(root))
    return root


def _fake_job(runs: Path, kind: str, argv: list[str], status: dict, name: str = "x") -> Path:
    """A job folder as `engine.jobs.launch` leaves it; `running` jobs carry this (alive) process's pid."""
    job = runs / f"20000101-000000_{kind}_{name}"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"kind": kind, "argv": argv, "created": time.time() - 120,
                                              "pid": os.getpid(), "pgid": None}))
    (job / "status.json").write_text(json.dumps({"pid": os.getpid(), **status}))
    return job


def _evaluation(draft: str, speedups: list[float]) -> dict:
    by_k = {str(k): {"k": k, "mean_acceptance_length": 1.2 + 0.1 * k, "per_position_acceptance": [0.2] * k,
                     "all_positions_acceptance_length": 1.3} for k in range(1, len(speedups) + 1)}
    fc = {str(k): {"mean_acceptance_length": 1.2, "verify_cost": 1.0, "draft_cost": 0.5, "step_cost": 1.5,
                   "speedup": s} for k, s in enumerate(speedups, 1)}
    return {"num_samples": 3, "max_new_tokens": 16, "draft": draft, "by_k": by_k,
            "forecast": {"by_k": fc, "recommended_k": 1, "target_step_ms": 5.0}}  # an old record: "1" below 1x


# -- start page -----------------------------------------------------------------------------------------------


def test_the_app_opens_on_the_start_page_with_the_workflow_and_its_state(runs, tiny_targets):
    target = str(tiny_targets["llama"])
    at = open_app(target)  # no page switch: what a new user sees first
    assert at.title[0].value == "Speculators Workbench"
    body = texts(at.markdown)
    assert "draft" in body and "target" in body and "faster" in body  # what the workbench is for
    for step in ("1. Target", "2. Data", "3. Train", "4. Evaluate", "5. Serve"):
        assert step in body, step
    links = {link.proto.page for link in at.get("page_link")}  # one button per step, by the page's own URL
    assert {"models", "data", "train", "benchmarks", "serve", "demo_chat"} <= links, links
    # no draft and no data for this target: the next step is the data, and the steps say so
    assert "No extraction for this target yet." in body and "Next step for this target: **Data**" in body
    assert not at.error, texts(at.error)
    # an extraction of this target appears: the data step is done, training is next
    folder = runs / "extract" / "tiny"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"target": target, "samples": 4}))
    at = open_app(target)
    body = texts(at.markdown)
    assert "1 extraction for this target." in body and "Next step for this target: **Train**" in body
    assert ":green[:material/check_circle:] **2. Data**" in body


def test_the_data_step_is_not_checked_when_it_is_only_not_needed(runs):
    from ui import start as start_ui

    at = open_app(BUILTIN, "auto")  # the shipped draft is active and no extraction of the target exists
    body = texts(at.markdown)
    assert "No extraction for this target yet: not needed to use the active draft" in body
    assert ":gray[:material/remove_circle_outline:] **2. Data**" in body  # not a green check
    assert ":green[:material/check_circle:] **2. Data**" not in body
    steps = start_ui.steps(BUILTIN, "some/draft", None)
    assert not steps[1].done and not steps[1].needed and start_ui.next_step(steps).title != "2. Data"


def test_start_page_for_the_builtin_target_names_the_shipped_drafts_measured_speed(runs):
    from ui import bench, catalog

    at = open_app(BUILTIN, "auto")
    body = texts(at.markdown)
    speed = bench.draft_speed(catalog.shipped_draft(BUILTIN))
    assert speed is not None and f"Measured for this draft: **{speed['speedup']:.2f}×**" in body
    assert speed["where"] in body


def test_a_shipped_record_of_this_cpu_kind_is_not_said_to_have_run_on_this_machine(runs, tmp_path, monkeypatch):
    """Issue 65: on an AVX2 EPYC with nothing run here, the shipped AVX2 evaluation is named as a shipped record from
    a CPU of this kind, and the Evaluate step gets no check; the user's own evaluation then gets it."""
    from engine import cpu
    from ui import catalog, records
    from ui import start as start_ui

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2\n")
    monkeypatch.setattr(cpu, "_CPUINFO", info)
    records.this_cpu.cache_clear()
    try:
        draft = catalog.shipped_draft(BUILTIN)
        avx2 = records.SHIPPED / "evaluate" / "amd-epyc-avx2" / "workloads_eagle3.json"
        record = json.loads(avx2.read_text())
        assert records.on_this_machine(record)  # the CPU kind matches ...
        assert records.provenance(record, avx2, shipped=True).startswith("a CPU of this kind (AMD EPYC, AVX2)")
        step = start_ui.steps(BUILTIN, draft, None)[3]
        assert not step.done and "on this machine (" not in step.status and "Measured on this machine" not in \
            step.status and step.status.startswith("Not run on this machine yet (on record: shipped `")
        result = runs / "evaluate" / "mine.json"
        result.parent.mkdir(parents=True)
        result.write_text(json.dumps(_evaluation(draft, [1.1])))
        _fake_job(runs, "evaluate", ["evaluate", "--draft", draft, "--json", str(result)], {"state": "done"})
        step = start_ui.steps(BUILTIN, draft, None)[3]
        assert step.done and step.status.startswith("Evaluated on this machine (your job `")
    finally:
        records.this_cpu.cache_clear()


def test_every_page_has_a_url_of_its_own():
    """Typed URLs work: every page but the start page ("/") has its file name as url_path."""
    import ast

    from ui.start import url_path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "app.py").read_text())
    assert any(isinstance(n, ast.keyword) and n.arg == "url_path" for n in ast.walk(tree))
    assert url_path("pages/demo_chat.py") == "demo_chat" and url_path("pages/models.py") == "models"


# -- one source per figure ------------------------------------------------------------------------------------


def test_the_shipped_drafts_speed_agrees_on_models_card_and_benchmarks(runs):
    """Models (draft tab), the model card tab and the Benchmarks page show the same measured speedup for the
    shipped draft, from the same record, with the machine it was measured on."""
    from ui import bench, catalog

    draft = catalog.shipped_draft(BUILTIN)
    speed = bench.draft_speed(draft)
    assert speed is not None, "a shipped benchmark of the shipped draft"
    sentence = bench.draft_speed_text(speed)
    at = open_app(BUILTIN, "auto", page="models")
    assert texts(at.markdown).count(sentence) == 1  # the draft tab
    assert sentence in texts(at.info)               # the model card tab
    assert "<!--" not in texts(at.markdown)         # the card's generated-section markers are not shown raw
    at = open_app(BUILTIN, "auto", page="benchmarks")
    assert at.selectbox(key="bench_result").value == speed["key"]  # opens on the same record
    table = at.dataframe[0].value
    shown = table.loc[table["method"] == "draft", "speedup"].iloc[0]
    assert shown == f"{speed['speedup']:.2f}×"
    assert speed["where"] in texts(at.caption)


def test_the_shipped_drafts_acceptance_per_workload_is_on_the_models_page_and_its_card(runs):
    """The Models page shows the freshest evaluation with workloads (the shipped record here): a row per workload
    with each k's interval, the chart, and where it was measured; the card tab holds the same table."""
    from ui import catalog
    from ui import evaluate as evaluate_ui

    draft = catalog.shipped_draft(BUILTIN)
    ev = next(e for e in evaluate_ui.all_results(draft) if e.result.get("by_workload"))
    at = open_app(BUILTIN, "auto", page="models")
    tables = [d.value for d in at.dataframe if "workload" in d.value.columns]
    assert len(tables) == 1
    shown = tables[0]
    assert list(shown["kind"]) == [w["kind"] for w in ev.result["by_workload"]] == ["chat", "code"]
    assert list(shown["k = 3"]) == [r["k = 3"] for r in evaluate_ui.workload_rows(ev.result)]
    assert "(" in shown["k = 3"].iloc[0] and ev.where in texts(at.caption)
    assert "Acceptance per workload" in texts(at.markdown)
    card = texts(at.markdown) + texts(at.info)
    assert "| humaneval | code | 20 |" in card  # the model card tab
    parity = next(t.value for t in at.table if "factor" in t.value.columns)  # training against serving
    recorded = dict(zip(parity["factor"], parity["training"], strict=True))
    verdicts = dict(zip(parity["factor"], parity["verdict"], strict=True))
    # issue 65: the shipped draft's factors come from the records its recipe kept, and the context length differs
    assert recorded["aux layer ids (vLLM numbering)"] == "[2, 15, 27]" and recorded["hidden-state dtype"] == "bf16"
    assert "Q4_1 GGUF" in recorded["target weights"] and "dequantized to fp32" in recorded["target weights"]
    assert "greedy" in recorded["training answers"] and recorded["context length"] == "up to 768 tokens"
    assert verdicts["context length"] == "differs" and verdicts["target weights"] == "same"
    assert "benchmarks/results/reship-eagle3/amd-epyc-zen4/recipe" in texts(at.caption)


def test_an_evaluation_measured_under_load_is_flagged_in_its_table_and_protocol():
    """Issue 65: a forecast from step costs measured under load, and a kernel path chosen under load, say so."""
    from ui import evaluate as evaluate_ui

    result = _evaluation("d", [1.1, 1.2])
    result["forecast"]["label"] = "under load (other processes used 40% of the CPUs)"
    result["kernel"] = ("fp32 (measured at first load on AMD EPYC, torch 2.13.0; bit-identical: speculative output "
                        "equals the baseline's; measured under load (other processes used 30% of the CPUs)): ...")
    assert {r["step costs measured"] for r in evaluate_ui.table_rows(result)} == {"under load"}
    assert "kernel fp32 (chosen under load)" in evaluate_ui.protocol(result)
    assert "no advice from this forecast" in evaluate_ui.recommendation(result)
    quiet = _evaluation("d", [1.1, 1.2])
    assert "step costs measured" not in evaluate_ui.table_rows(quiet)[0]
    assert "under load" not in evaluate_ui.protocol({**quiet, "kernel": "fp32 (measured at first load on X)"})


def test_a_small_evaluation_does_not_replace_a_larger_one_unasked(runs):
    """Issue 65: a 1-prompt evaluation of yours is listed with its size and offered, while the Models page keeps
    showing the larger shipped one; picked, it shows, and no count reads "1 held-out prompts"."""
    from ui import catalog
    from ui import evaluate as evaluate_ui

    draft = catalog.shipped_draft(BUILTIN)
    big = evaluate_ui.largest(evaluate_ui.all_results(draft))
    assert evaluate_ui.size(big.result) >= 20 * 128
    result = runs / "evaluate" / "small.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({**_evaluation(draft, [1.1]), "num_samples": 1, "max_new_tokens": 8}))
    _fake_job(runs, "evaluate", ["evaluate", "--draft", draft, "--json", str(result)], {"state": "done"})
    small = evaluate_ui.all_results(draft)[0]
    assert not small.shipped and evaluate_ui.protocol(small.result).startswith("1 held-out prompt × 8 new tokens ·")
    at = open_app(BUILTIN, "auto", page="models")
    ok(at)
    assert at.selectbox(key="models_eval_shown").value == evaluate_ui.label(big)
    assert f"{evaluate_ui.protocol(big.result)}; from {big.where}." in texts(at.caption)
    assert "Your newer evaluation (1 held-out prompt × 8 new tokens" in texts(at.info)  # offered, not shown
    k_table = next(d.value for d in at.dataframe if "k" in d.value.columns)
    assert len(k_table) == len(big.result["by_k"]) > 1
    at.selectbox(key="models_eval_shown").set_value(evaluate_ui.label(small)).run()
    ok(at)
    assert "1 held-out prompt × 8 new tokens" in texts(at.caption) and "1 held-out prompts" not in texts(at.caption)
    assert len(next(d.value for d in at.dataframe if "k" in d.value.columns)) == 1
    assert evaluate_ui.counted(1, "sample") == "1 sample" and evaluate_ui.counted(2, "sample") == "2 samples"


def test_shipped_offline_evaluations_are_listed_with_their_machine(runs, tiny_targets):
    from ui import evaluate as evaluate_ui

    shipped = evaluate_ui.shipped_results()
    assert shipped, "benchmarks/results/evaluate/*.json ship"
    at = open_app(str(tiny_targets["llama"]), page="benchmarks")
    body = texts(at.markdown)
    assert "No offline evaluation yet" not in texts(at.caption)
    for ev in shipped:  # each with where it comes from: its file, its CPU (or that none is recorded), its date
        assert ev.where in body and any(w in ev.where for w in ("another machine", "CPU not recorded",
                                                                 "a CPU of this kind"))
        assert "this machine" not in ev.where  # a shipped record never ran here (issue 65)


def test_an_evaluation_without_forecast_has_no_forecast_columns_and_run_drafts_say_whose_run():
    """A record made without a forecast (the recipes' `forecast: false`) shows no empty forecast columns; a run's
    generic `draft` folder is named with its run."""
    from ui import bench
    from ui import evaluate as evaluate_ui

    with_forecast = _evaluation("drafts/a", [1.1, 1.2])
    assert "forecast speedup" in evaluate_ui.table_rows(with_forecast)[0]
    rows = evaluate_ui.table_rows({**with_forecast, "forecast": None})
    assert [r["k"] for r in rows] == [1, 2] and not any("forecast" in c or "step cost" in c for c in rows[0])
    assert bench.short_name("runs/recipes/smollm2-dflash/train/draft") == "smollm2-dflash/train/draft"
    assert bench.short_name("runs/train/x/checkpoints/step_0000100") == "x/checkpoints/step_0000100"
    assert bench.short_name("assets/drafts/smollm2-135m-instruct-dflash") == "smollm2-135m-instruct-dflash"


def test_a_llama_cpp_forecast_gets_its_own_columns_and_the_evaluator_command_asks_for_it():
    from engine.measure.llamacpp_costs import forecast_llamacpp
    from ui import evaluate as evaluate_ui

    ev = _evaluation("drafts/a", [1.1, 1.5])  # tau 1.3 at k = 1, 1.4 at k = 2
    ev["forecast_llamacpp"] = forecast_llamacpp(ev["by_k"], {"target_step_ms": 20.0,
                                                             "step_cost": {"1": 1.25, "2": 1.4}})
    rows = evaluate_ui.table_rows(ev)
    assert [r["llama.cpp forecast"] for r in rows] == [round(1.3 / 1.25, 3), round(1.4 / 1.4, 3)]
    assert ev["forecast_llamacpp"]["recommended_k"] == 1 and "k = 1" in ev["forecast_llamacpp"]["advice"]
    slow = forecast_llamacpp(ev["by_k"], {"target_step_ms": 20.0, "step_cost": {"1": 2.0, "2": 2.04}})
    assert slow["recommended_k"] is None and slow["fastest_k"] == 2
    assert "no k pays in llama.cpp" in slow["advice"] and "τ ≥ 2.04" in slow["advice"]
    assert "llama.cpp forecast" not in evaluate_ui.table_rows(_evaluation("drafts/a", [1.1]))[0]
    argv = evaluate_ui.evaluate_argv("d", "t", num_prompts=4, max_new_tokens=8, out="o.json", llamacpp=True)
    assert argv[argv.index("--forecast-engines") + 1] == "in-process,llama.cpp"


def test_no_k_is_recommended_when_every_forecast_is_below_one(runs, tiny_targets, tmp_path):
    """An evaluation whose forecast is below 1x at every k: the page advises no speculation (an older record that
    still says "recommended k 1" included)."""
    draft = tmp_path / "drafts" / "slow-draft"
    draft.mkdir(parents=True)
    result = runs / "evaluate" / "slow.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps(_evaluation(str(draft), [0.83, 0.5, 0.06])))
    _fake_job(runs, "evaluate", ["evaluate", "--draft", str(draft), "--json", str(result)], {"state": "done"})
    from ui import evaluate as evaluate_ui

    ev = evaluate_ui.all_results(str(draft))[0]
    advice = evaluate_ui.recommendation(ev.result, ev.here)
    assert advice.startswith("no speculation") and "recommended k" not in advice and "0.83×" in advice
    fast = _evaluation(str(draft), [0.9, 1.2])
    assert evaluate_ui.recommendation(fast).startswith("recommended k on this machine: 2")


def test_benchmarks_record_verdict_never_advises_the_slower_proposer():
    from ui import bench

    base = {"key": "shipped · x.json", "where": "this machine", "k": 3, "prompts": 20, "max_new_tokens": 128}
    assert "n-gram is faster" in bench.draft_speed_text({**base, "speedup": 1.19, "ngram_speedup": 1.40})
    assert "slower than no speculation" in bench.draft_speed_text({**base, "speedup": 0.81, "ngram_speedup": 0.9})
    assert "faster" not in bench.draft_speed_text({**base, "speedup": 1.3, "ngram_speedup": 1.1}).split("—")[1]
    assert "(one run, no spread)" in bench.draft_speed_text({**base, "speedup": 1.3})
    assert "(95% interval 1.25–1.35 over 4 interleaved rounds)" in bench.draft_speed_text(
        {**base, "speedup": 1.3, "ci95": [1.25, 1.35], "rounds": 4})


def test_the_advice_is_the_best_measured_k_of_a_sweep_on_this_machine():
    from ui import evaluate as evaluate_ui

    result = _evaluation("d", [1.4, 1.1])  # the forecast says k = 1
    rows = [{"k": 1, "speedup": 1.05, "spread": {"ci95": [1.0, 1.1]}},
            {"k": 2, "speedup": 1.25, "spread": {"ci95": [1.2, 1.3]}}]
    measured = evaluate_ui.recommendation(result, True, {"rows": rows, "here": True})
    assert measured.startswith("recommended k on this machine: 2 (measured 1.25×") and "forecast 1.10×" in measured
    # a sweep measured on another machine does not replace this machine's forecast
    assert evaluate_ui.recommendation(result, True, {"rows": rows, "here": False}).startswith(
        "recommended k on this machine: 1 (forecast 1.40×")


# -- progress ----------------------------------------------------------------------------------------------


def test_tracked_writes_progress_and_time_left_into_the_jobs_status(tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.JOB_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(jobs, "_REPORTER", None)
    seen = []
    for _ in jobs.tracked(range(4), desc="the target answers the held-out prompts", span=(0.0, 0.8), every_s=0.0):
        seen.append(json.loads((tmp_path / jobs.STATUS).read_text()))
    final = json.loads((tmp_path / jobs.STATUS).read_text())
    assert seen[0]["progress"] == 0.0 and "0/4" in seen[0]["message"]
    assert "3/4" in seen[-1]["message"] and "left" in seen[-1]["message"]
    assert final["progress"] == pytest.approx(0.8) and "4/4" in final["message"]


def test_a_running_evaluation_shows_a_progress_bar_with_time_left(runs, tiny_targets):
    from ui import catalog

    draft = catalog.shipped_draft(BUILTIN)
    _fake_job(runs, "evaluate", ["evaluate", "--draft", draft, "--json", str(runs / "e.json")],
              {"state": "running", "progress": 0.4, "started": time.time() - 100,
               "message": "the target answers the held-out prompts: 4/10 (about 2 min 30 s left)"})
    at = open_app(BUILTIN, "auto", page="models")
    ok(at)
    bars = at.get("progress")
    assert bars, "no progress bar"
    text = bars[0].proto.text
    assert "40%" in text and "so far" in text, text
    assert "4/10 (about 2 min 30 s left)" in texts(at.markdown)  # one estimate: the job's own, for its phase


def test_progress_text_gives_elapsed_and_no_figure_it_cannot_back():
    from ui.jobs import progress_text

    s = jobs.JobStatus(state="running", progress=0.25, started=1000.0)  # no phase, no earlier run: no figure
    assert progress_text(s, now=1060.0) == "25% · 1 min 00 s so far · first run: measuring"
    done = jobs.JobStatus(state="done", progress=1.0, started=1000.0, updated=1090.0)
    assert progress_text(done) == "100% · took 1 min 30 s"


def _run_job(root, name: str, kind: str, prompts: int, monkeypatch, *, stop_after: int | None = None,
             measure_s: float = 0.0) -> list[dict]:
    """A job folder under `root` whose process runs two phases the way `evaluate` does (tracked prompts, then an
    untracked measurement); returns the status.json seen at each prompt and after the measurement started."""
    job_dir = root / name
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"kind": kind, "argv": [kind], "created": time.time()}))
    monkeypatch.setenv(jobs.JOB_DIR_ENV, str(job_dir))
    monkeypatch.setattr(jobs, "_REPORTER", None)
    seen = []
    for i in jobs.tracked(range(prompts), desc="the target answers the held-out prompts", span=(0.0, 0.9),
                          every_s=0.0):
        seen.append(json.loads((job_dir / jobs.STATUS).read_text()))
        time.sleep(0.4)
        if stop_after is not None and i + 1 >= stop_after:
            return seen
    rep = jobs.reporter()
    rep.phase("measuring the step costs on this machine", progress=0.95)
    seen.append(json.loads((job_dir / jobs.STATUS).read_text()))
    time.sleep(measure_s)
    rep.finish("done")
    return seen


def test_time_estimates_learn_from_this_machines_last_run_of_the_same_kind(tmp_path, monkeypatch):
    from ui.jobs import time_left

    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path))
    first = _run_job(tmp_path, "20260101-000000_evaluate", "evaluate", 3, monkeypatch, measure_s=1.0)
    for seen in (first[0], first[-1]):  # the prompts, then the measurement: nothing learned yet, so no figure
        status = jobs.JobStatus(**seen)
        assert time_left(status, status.phases[-1]["start"], kind="evaluate", job_id="20260101-000000_evaluate") \
            == "first run: measuring"
    assert "left" in first[1]["message"]  # from the second prompt on: the phase's own rate
    took = {ph["name"]: ph["end"] - ph["start"]
            for ph in json.loads((tmp_path / "20260101-000000_evaluate" / jobs.STATUS).read_text())["phases"]}
    answers, measure = took["the target answers the held-out prompts"], took["measuring the step costs on this machine"]
    assert answers >= 1.2 and measure >= 1.0  # a whole second apart from twice as long
    # the next run of the same kind: 6 prompts, twice the 3 the last one answered, then the same measurement
    second = _run_job(tmp_path, "20260101-000001_evaluate", "evaluate", 6, monkeypatch, stop_after=2)
    status = jobs.JobStatus(**second[0])
    start = status.phases[-1]["start"]
    assert time_left(status, start, kind="evaluate", job_id="20260101-000001_evaluate") == \
        f"about {jobs.duration_text(2 * answers + measure)} left (as your last run took)"
    assert time_left(status, start + 1.0, kind="evaluate", job_id="20260101-000001_evaluate") == \
        f"about {jobs.duration_text(2 * answers + measure - 1.0)} left (as your last run took)"  # counted down
    status = jobs.JobStatus(**second[1])  # its own rate from the second prompt on, then what the rest took
    own, at = status.phases[-1]["left_s"], status.phases[-1]["left_at"]
    assert time_left(status, at, kind="evaluate", job_id="20260101-000001_evaluate") == \
        f"about {jobs.duration_text(own + measure)} left (as your last run took)"
    assert time_left(status, at, kind="bench", job_id="x") == f"about {jobs.duration_text(own)} left"  # its own
    status = jobs.JobStatus(**second[0])
    assert time_left(status, start, kind="bench", job_id="x") == "first run: measuring"  # another kind: nothing


def test_charts_keep_legends_off_axis_titles_scale_heat_maps_to_the_data_and_name_the_proposer():
    from ui import charts
    from ui.chat import explain_row

    result = {"methods": {"baseline": {"speedup": 1.0}, "draft": {"speedup": 0.8, "mean_acceptance_length": 1.5,
                                                                   "per_position_acceptance": [0.3, 0.1],
                                                                   "speedup_ceiling": 1.2},
                          "ngram": {"speedup": 1.3, "mean_acceptance_length": 2.0,
                                    "per_position_acceptance": [0.6, 0.4]}},
              "k": 2, "num_prompts": 3}
    for fig in charts.bench_figures(result).values():
        legend = fig.layout.legend
        assert legend.orientation == "v" and legend.x > 1  # beside the plot, never over the x-axis title
    speed = charts.bench_figures(result)["speedup"]
    assert [a.text for a in speed.layout.annotations if a.text == "baseline"]
    assert all(a.xanchor == "left" and a.x == 1 for a in speed.layout.annotations if a.text == "baseline")
    heat = charts.acceptance_heatmap([[0.05, 0.3], [0.2, None]], ["prompt 1", "prompt 2"], "draft").data[0]
    assert charts.acceptance_heatmap([[0.5]], ["prompt 1"], "draft").layout.xaxis.type == "category"
    assert heat.zmax == pytest.approx(0.3) and heat.colorscale[1][1] != "#ffffff"  # 5% is tinted, not white
    assert "n-gram" in charts.acceptance_bars([1, 2, 3], 3, "n-gram").layout.title.text
    assert charts._mode([1], "train") == "lines+markers" == charts._mode([1, 2, 3], "train")
    row = explain_row({"label": "draft", "mean_acceptance_length": 1.67, "tokens_per_step": 1.1, "speedup": 0.9,
                       "ceiling": 1.3, "step_cost": 1.2})
    assert list(row).index("ceiling (free drafting)") < 5  # visible without scrolling sideways
    assert "tokens per step (all steps)" in row and "mean acceptance length (drafted steps)" in row


# -- values from a default are said, and can be changed before writing --------------------------------------------


def test_convert_dry_run_says_the_aux_layer_ids_came_from_a_default(runs, tiny_target, tiny_draft, tmp_path):
    src = research_checkpoint(tiny_draft, tmp_path / "research")  # its config records no aux layer ids
    verifier = tmp_path / "deep-verifier"  # a 30-layer verifier's config: vLLM's default ids are [2, 15, 27]
    verifier.mkdir()
    cfg = json.loads((Path(tiny_target) / "config.json").read_text())
    (verifier / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 30}))
    at = open_app(tiny_target, page="convert")
    at.text_input(key="convert_path").set_value(str(src)).run()
    at.text_input(key="convert_verifier").set_value(str(verifier)).run()
    at.button(key="convert_dry").click().run()
    ok(at)
    warning = texts(at.warning)
    assert "aux layer ids from a default" in warning and "[2, 15, 27]" in warning and "Aux layer ids" in warning
    assert "2" in str(at.json[-1].value)  # the config itself is shown open
    at.text_input(key="convert_aux").set_value("1, 2, 3").run()  # given: no longer a default
    at.button(key="convert_dry").click().run()
    ok(at)
    assert "from a default" not in texts(at.warning)


def test_config_builder_says_what_is_wrong_in_words_under_the_field_that_is_wrong(runs, tiny_target, tiny_draft):
    from engine.format.validate import validate_draft

    cfg = json.loads((Path(tiny_draft) / "config.json").read_text())
    k_path = "speculators_config.proposal_methods[0].speculative_tokens"
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 0
    words = " ".join(i.message for i in validate_draft(cfg, check_weights=False).errors)
    assert "Input should" not in words
    hidden = json.loads((Path(tiny_draft) / "config.json").read_text())
    h = hidden["transformer_layer_config"]["hidden_size"]
    hidden["transformer_layer_config"]["hidden_size"] = h + 1
    hidden.pop("target_hidden_size", None)
    tcfg = json.loads((Path(tiny_target) / "config.json").read_text())
    fields = {i.field: i.message for i in validate_draft(hidden, verifier_config=tcfg, check_weights=False).errors}
    assert "target_hidden_size" not in fields, fields
    assert f"set hidden size to {h}" in fields["transformer_layer_config.hidden_size"], fields
    assert k_path  # the k field's own finding is checked in the page below
    at = open_app(tiny_target, tiny_draft, page="config_builder")
    at.button(key="builder_from_draft").click().run()
    ok(at)
    box = next(w for w in at.number_input if "speculative tokens" in w.label)
    box.set_value(0).run()
    ok(at)
    caption = texts(at.caption)
    assert "must be at least 1, got 0" in caption or "must be a positive integer, got 0" in caption, caption
    assert "Input should" not in caption


def test_a_chat_turn_reports_tokens_so_far_speed_and_time_left():
    from types import SimpleNamespace

    from ui.chat import race_progress

    sides = {"baseline": SimpleNamespace(ids=list(range(24)), tokens_per_s=6.0, done=False),
             "draft": SimpleNamespace(ids=list(range(48)), tokens_per_s=8.0, done=True)}
    fraction, text = race_progress(SimpleNamespace(sides=sides, elapsed=30.0),
                                   {"baseline": "Baseline", "draft": "Draft model, k=3"}, 48)
    assert fraction == pytest.approx((24 / 48 + 1.0) / 2)
    assert "Baseline 24/48 tokens, 6.0 tokens/s" in text and "Draft model, k=3 48/48 tokens" in text
    assert "30 s so far" in text and "about 4 s left" in text  # (48 - 24) / 6


def test_the_identical_badge_says_which_comparison_it_makes():
    """Issue 27: the Demo chat's badge says whether equal output is guaranteed (bit-identical kernel path) or only
    happened (lossless path), and why outputs may differ on a lossless path at temperature 0."""
    from ui.chat import identical_badge, kernel_exact

    kernel = {"path": "bf16-plain", "candidates": {"bf16-plain": {"row_exact": False}, "fp32": {"row_exact": True}}}
    assert kernel_exact(kernel) is False and kernel_exact({**kernel, "path": "fp32"}) is True
    assert kernel_exact({"path": "fp32"}) is None and kernel_exact(None) is None
    text, color, _ = identical_badge("Draft model", True, True, 0.0)
    assert color == "green" and "bit-identical kernel path" in text
    text, _, _ = identical_badge("Draft model", True, False, 0.0)
    assert "not guaranteed" in text and "lossless" in text
    text, color, why = identical_badge("Draft model", False, False, 0.0)
    assert color == "orange" and "near-tie" in why and "--dtype auto" in why
    assert "temperature > 0" in identical_badge("Draft model", False, True, 0.7)[2]


def test_a_redrafted_folder_is_credited_only_with_the_figures_of_its_own_weights(tmp_path, monkeypatch):
    """A re-shipped draft keeps its folder: records of the weights it had before (another `draft_sha256`) are not
    its speed; records from before digests were kept count only while none measured these weights."""
    import torch

    from engine.format.checkpoint import save_checkpoint, weights_sha256
    from ui import bench

    draft = save_checkpoint(tmp_path / "drafts" / "mine", {"v": 1}, {"w": torch.ones(3)})
    paths = {}

    def record(name: str, speedup: float, **extra) -> None:
        paths[f"{bench.SHIPPED_PREFIX}{name}"] = path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"draft": str(draft), "k": 3, "date": "2026-12-01", **extra,
                                    "methods": {"draft": {"speedup": speedup, "mean_acceptance_length": 1.5}}}))

    monkeypatch.setattr(bench, "results", lambda: dict(paths))
    record("legacy", 0.9)
    assert bench.draft_speed(str(draft))["speedup"] == 0.9       # nothing better known
    record("predecessor", 1.1, draft_sha256="0" * 64)
    assert bench.draft_speed(str(draft))["speedup"] == 0.9       # another weights' figure never counts
    record("these", 1.3, draft_sha256=weights_sha256(draft))
    assert bench.draft_speed(str(draft))["speedup"] == 1.3
    record("these-in-vllm", 1.2, draft_sha256=weights_sha256(draft), backend="vllm", date="2026-12-02")
    assert bench.draft_speed(str(draft))["speedup"] == 1.3       # the engine the app runs comes first
    del paths[f"{bench.SHIPPED_PREFIX}legacy"], paths[f"{bench.SHIPPED_PREFIX}these"]
    assert bench.draft_speed(str(draft))["speedup"] == 1.2       # then real vLLM
    del paths[f"{bench.SHIPPED_PREFIX}these-in-vllm"]
    assert bench.draft_speed(str(draft)) is None


def test_shipped_evaluations_of_a_redrafted_folder_are_those_of_its_current_weights(tmp_path, monkeypatch):
    """The offline evaluations the Models page lists for a draft: not those of the weights its folder held before."""
    import torch

    from engine.format.checkpoint import save_checkpoint, weights_sha256
    from ui import evaluate as evaluate_ui
    from ui import records

    draft = save_checkpoint(tmp_path / "drafts" / "mine", {"v": 1}, {"w": torch.ones(3)})
    shipped = tmp_path / "results"
    shipped.mkdir()
    for name, digest in (("before", "0" * 64), ("legacy", None), ("now", weights_sha256(draft))):
        (shipped / f"{name}.json").write_text(json.dumps({"draft": str(draft), "by_k": {"3": {}},
                                                          **({"draft_sha256": digest} if digest else {})}))
    monkeypatch.setattr(records, "SHIPPED", shipped)
    assert [e.where.split("`")[1] for e in evaluate_ui.shipped_results(str(draft))] == ["now.json"]
    (shipped / "now.json").unlink()
    assert [e.where.split("`")[1] for e in evaluate_ui.shipped_results(str(draft))] == ["legacy.json"]


def test_records_of_the_trained_folder_are_the_shipped_drafts_when_the_bytes_are_the_same(tmp_path, monkeypatch):
    """A recipe measures its training folder and ships the same bytes: those records are the shipped draft's
    (same `draft_sha256`); a record of another folder with other weights is not."""
    import torch

    from engine.format.checkpoint import save_checkpoint, weights_sha256
    from ui import bench, records
    from ui import evaluate as evaluate_ui

    trained = save_checkpoint(tmp_path / "runs" / "recipe" / "train" / "draft", {"v": 1}, {"w": torch.ones(3)})
    shipped_draft = save_checkpoint(tmp_path / "drafts" / "mine", {"v": 1}, {"w": torch.ones(3)})
    other = save_checkpoint(tmp_path / "runs" / "other" / "draft", {"v": 1}, {"w": torch.zeros(3)})
    assert weights_sha256(trained) == weights_sha256(shipped_draft) != weights_sha256(other)
    shipped = tmp_path / "results"
    shipped.mkdir()
    for name, folder in (("recipe", trained), ("other", other)):
        (shipped / f"{name}.json").write_text(json.dumps({
            "draft": str(folder), "draft_sha256": weights_sha256(folder), "by_k": {"3": {}}, "k": 3,
            "date": "2026-12-03", "methods": {"draft": {"speedup": 1.2 if name == "recipe" else 2.0}}}))
    monkeypatch.setattr(records, "SHIPPED", shipped)
    assert [e.where.split("`")[1] for e in evaluate_ui.shipped_results(str(shipped_draft))] == ["recipe.json"]
    monkeypatch.setattr(bench, "results", lambda: {f"{bench.SHIPPED_PREFIX}{p.stem}": p for p in shipped.glob("*")})
    assert bench.draft_speed(str(shipped_draft))["speedup"] == 1.2


def test_this_machine_is_matched_on_the_cpu_kind_not_the_brand(tmp_path, monkeypatch):
    """A record of the AMD EPYC Zen 4 (AVX-512 BF16, native bf16) is not credited to an AVX2-only AMD EPYC of the
    same model name, where bf16 is emulated and the figures differ 2x; on a Zen 4 it is, and an AVX2 record is not."""
    from engine import cpu
    from ui import bench, records

    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(cpu, "_CPUINFO", info)
    monkeypatch.setattr(bench, "results", bench.shipped_results)  # the shipped records alone, not this user's runs
    zen4 = json.loads((records.SHIPPED / "reship-eagle3" / "amd-epyc-zen4" / "bench.json").read_text())
    avx2 = json.loads((records.SHIPPED / "step_cost" / "amd-epyc-avx2.json").read_text())
    shipped_draft = str(records.ROOT / "assets" / "drafts" / "smollm2-135m-instruct-eagle3")
    try:
        for flags, kind in (("avx2", "AVX2"), ("avx2 avx512f avx512_bf16", "AVX-512 BF16")):
            info.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 {flags}\n")
            records.this_cpu.cache_clear()
            assert records.this_cpu() == {"cpu": "AMD EPYC", "cpu_kind": kind} and zen4["cpu"] == "AMD EPYC"
            on_zen4 = kind == "AVX-512 BF16"
            assert records.on_this_machine(zen4) is on_zen4 and records.on_this_machine(avx2) is not on_zen4
            assert records.provenance(zen4).startswith("this machine" if on_zen4 else
                                                       "another machine: AMD EPYC, AVX-512 BF16")
            speed = bench.draft_speed(shipped_draft)  # what every page says of the shipped draft's speed
            # the shipped draft's newest Zen 4 record measured in rounds: its card's sweep (one speed per k)
            assert speed["key"] == bench.SHIPPED_PREFIX + "reship-eagle3/amd-epyc-zen4-2026-12-04/sweep.json"
            assert speed["ci95"] and speed["rows"]
            assert speed["here"] is on_zen4
    finally:
        records.this_cpu.cache_clear()


def test_the_acceptance_by_answer_position_chart_shows_the_buckets_with_drafts_and_the_first_position_gap():
    import torch

    from engine.generate.acceptance import Acceptance, HeldOutSample, walk
    from ui import charts

    sample = HeldOutSample(torch.arange(30), torch.zeros(30, 4), 3, 29)
    acc = Acceptance(2)
    a = [2, 0, 0] * 10
    acc.add(walk(a, sample, 2), [min(a[q], 2, sample.end - q) for q in range(3, 29)])
    fig = charts.acceptance_by_position({"best_k": 2, "by_k": {"2": acc.to_dict()}})
    bars = fig.data[0]
    assert list(bars.x) == ["0–0", "1–3", "4–15", "16–63"]  # empty buckets left out
    assert list(bars.customdata) == [b["num_drafts"] for b in acc.to_dict()["by_answer_position"] if b["num_drafts"]]
    assert "first token 1.00 at draft starts" in fig.layout.title.subtitle.text
    assert charts.acceptance_by_position({"best_k": 2, "by_k": {"2": {"mean_acceptance_length": 1.5}}}) is None
