"""Every page of the Streamlit app through `streamlit.testing.v1.AppTest`, on a tiny random target and draft.

Jobs go to a temporary runs folder ($WORKBENCH_RUNS); anything still running at the end of a test is stopped.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine import jobs
from testkit.app import PAGES, ROOT, TITLES, ok, only_job, open_app, research_checkpoint, texts, wait_for

# -- frame ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_with_cli_command(runs, tiny_target, page):
    at = open_app(tiny_target, page=page)
    assert at.title[0].value == TITLES[page]
    assert "python -m engine" in texts(at.code), f"{page} shows no equivalent CLI command"
    assert not at.error, texts(at.error)


def test_sidebar_shows_models_device_and_running_jobs(runs, tiny_target, tiny_draft):
    job = jobs.launch(["targets", "--prepare", "none"], root=runs)  # finishes fast; a fake one stays "running"
    fake = runs / "20000101-000000_train_fake"
    fake.mkdir(parents=True)
    (fake / "job.json").write_text(json.dumps({"kind": "train", "argv": ["train"], "created": time.time(),
                                               "pid": None, "pgid": None}))
    import os

    (fake / "status.json").write_text(json.dumps({"state": "running", "message": "step 3/10", "progress": 0.3,
                                                  "pid": os.getpid()}))
    at = open_app(tiny_target, tiny_draft)
    side = texts(at.sidebar.markdown)
    assert "**Target**" in side and "tiny" in side
    assert "**Draft**" in side and "tiny-eagle3" in side
    assert "**Device** · CPU" in side or "**Device** · GPU" in side
    if "**Device** · CPU" in side:  # the CPU's model name (not "CPU (2 cores)") and the kernel path line
        from engine.cpu import cpu_model

        assert f"CPU: {cpu_model()} (" in side and "**Kernels** ·" in side
    assert "**train** 30%" in side and "20000101-000000_train_fake" in side
    (fake / "status.json").write_text(json.dumps({"state": "stopped"}))
    jobs.wait(job, timeout=60)


def test_without_a_draft_the_sidebar_says_ngram_only(runs, tiny_target):
    at = open_app(tiny_target)
    assert "none — n-gram only" in texts(at.sidebar.markdown)


def test_engine_errors_are_messages_not_tracebacks(runs, tmp_path):
    missing = str(tmp_path / "no-such-model")
    at = open_app(missing, page="demo_chat")
    at.chat_input(key="chat_prompt").set_value("hello").run()
    ok(at)
    assert "could not load target" in texts(at.error)
    assert "What to do" in texts(at.info)
    at.switch_page("pages/models.py").run()
    ok(at)
    assert "Cannot use this target" in texts(at.error) and "no such folder" in texts(at.error)


# -- models -----------------------------------------------------------------------------------------------


def test_models_page_inspects_and_validates_the_draft(runs, tiny_target, tiny_draft, tmp_path):
    import shutil

    tiny_draft = str(shutil.copytree(tiny_draft, tmp_path / "tiny-eagle3"))
    (Path(tiny_draft) / "README.md").write_text("---\nlibrary_name: speculators\n---\n# Tiny draft\n\n"
                                                "## Training\n- 12 optimizer steps\n")
    at = open_app(tiny_target, tiny_draft, page="models")
    facts = {row["what"]: row["value"] for d in at.table if "what" in d.value.columns
             for row in d.value.to_dict("records")}
    assert facts["layers"] == "4" and facts["hidden_size"] == "64"  # the tiny target's config, as numbers
    assert facts["vocab_size"] == f"{int(facts['vocab_size'].replace(',', '')):,}"  # thousands separated
    assert facts["algorithm"] == "eagle3" and facts["aux layer ids"] == "1, 2, 3"
    assert {m.label for m in at.metric} >= {"parameters", "on disk", "tensors"}
    assert "160 draft tokens" in texts(at.caption)  # vocabulary mapping
    assert any("target id" in d.value.columns for d in at.dataframe)
    card = texts(at.markdown)  # the model card, front matter dropped, headings below the page's own
    assert "### Tiny draft" in card and "12 optimizer steps" in card and "library_name" not in card
    badges = texts(at.markdown)
    assert "vLLM 0.33: loads it" in badges and "workbench checks: pass" in badges
    assert f"python -m engine validate {tiny_draft}" in texts(at.code)
    assert '"method": "eagle3"' in texts(at.json)  # the derived vLLM speculative_config


def test_models_page_refuses_a_hub_target_that_is_not_cached(runs, tiny_target):
    at = open_app(tiny_target, page="models")
    at.radio(key="models_target_source").set_value("Hub id").run()
    at.text_input(key="models_target_hub").set_value("someone/not-cached-model").run()
    ok(at)
    assert at.button(key="models_use_target").disabled  # refused here, not when a chat message is sent
    assert "not in the local Hugging Face cache" in texts(at.error)
    assert "huggingface-cli download someone/not-cached-model" in texts(at.error)
    assert at.session_state["app_target"] == tiny_target


def test_models_page_switches_target_and_draft(runs, tiny_target, tiny_draft):
    at = open_app("smollm2-135m-instruct", page="models")
    at.radio(key="models_target_source").set_value("Local folder").run()
    at.text_input(key="models_target_folder").set_value(tiny_target).run()
    at.button(key="models_use_target").click().run()
    ok(at)
    assert at.session_state["app_target"] == tiny_target
    at.radio(key="models_draft_source").set_value("Local folder").run()
    at.text_input(key="models_draft_folder").set_value(tiny_draft).run()
    at.button(key="models_use_draft").click().run()
    ok(at)
    assert at.session_state["app_draft"] == tiny_draft
    assert at.button(key="models_use_draft").label == "Active draft"



def test_models_page_offers_every_shipped_draft_of_the_target_default_first(runs):
    """Drafts ship for the built-in target (EAGLE-3, the default, DFlash and DFlash2): another can be made active."""
    from engine.algos.shipped import default_draft, shipped_drafts

    shipped = [str(p) for p in shipped_drafts("smollm2-135m-instruct")]
    assert len(shipped) >= 2 and shipped[0] == str(default_draft("smollm2-135m-instruct"))
    at = open_app("smollm2-135m-instruct", "auto", page="models")
    assert at.radio(key="models_draft_source").value == "Shipped"
    pick = at.selectbox(key="models_draft_pick_shipped")
    assert pick.options[0].endswith("(default)") and pick.value == shipped[0]
    other = next(p for p in shipped if "dflash" in p)
    pick.set_value(other).run()
    at.button(key="models_use_draft").click().run()
    ok(at)
    assert at.session_state["app_draft"] == other
    assert at.radio(key="models_draft_source").value == "Shipped" and at.button(key="models_use_draft").label == \
        "Active draft"
    pick = at.selectbox(key="models_draft_pick_shipped")
    pick.set_value(shipped[0]).run()
    at.button(key="models_use_draft").click().run()
    assert at.session_state["app_draft"] == "auto"  # the default is kept as "auto" (it follows defaults.json)

# -- demo chat --------------------------------------------------------------------------------------------


def test_demo_chat_compares_baseline_draft_and_ngram_in_one_run_and_says_why(runs, tiny_target, tiny_draft):
    at = open_app(tiny_target, tiny_draft, page="demo_chat")
    assert at.multiselect(key="chat_proposers").value == ["draft", "ngram"]  # both beside the baseline by default
    assert "Draft:" in texts(at.caption)
    at.number_input(key="chat_max_new_tokens").set_value(40).run()
    at.chat_input(key="chat_prompt").set_value("Repeat: 1 2 3 4 5 6 7 8 9 10, 1 2 3 4 5 6 7 8 9 10").run()
    ok(at)
    history = at.session_state["chat_history"]
    assert len(history) == 1
    turn = history[0]
    assert list(turn["sides"]) == ["baseline", "draft", "ngram"]
    for name in ("draft", "ngram"):
        assert turn["sides"][name]["identical"], f"greedy {name} must reproduce the baseline"
        assert turn["sides"][name]["metrics"]["tokens"] == turn["sides"]["baseline"]["metrics"]["tokens"] > 0
        assert sum(turn["sides"][name]["step_lengths"]) + 1 >= turn["sides"][name]["metrics"]["tokens"]
        row = turn["explain"][name]
        assert row["step_cost"] > 0 and row["target_share"] > 0 and row["per_position_acceptance"]
        assert "tokens per step" in row["sentence"] and "a step costs" in row["sentence"]
        assert "Identical output: " + row["label"] in texts(at.markdown)
    md = texts(at.markdown)
    assert "Why this speed" in md and turn["explain"]["ngram"]["sentence"] in md
    assert turn["cost_curve"][turn["k"] + 1] > 0  # the target's cost curve, measured once and cached
    table = at.table[0].value  # one column per proposer, one row per quantity: no column cut off
    assert list(table.columns) == ["", "Draft model", "n-gram (prompt lookup)"]
    quantities = {"step cost (baseline steps)", "target verification", "drafting", "ceiling (free drafting)"}
    assert quantities <= set(table[""])
    if turn["kernel_rows"]:  # the kernel paths timed on this CPU: a table beside the explanation
        assert any("ms per token" in d.value.columns for d in at.dataframe)
    html = texts(at.html)
    assert 'class="baseline-answer"' in html and html.count('class="spec-answer"') == 2 and "tok tok-" in html
    assert "--method baseline" in turn["cli"] and "--method draft" in turn["cli"] and "--method ngram" in turn["cli"]
    # the history survives a rerun and a second prompt with one proposer adds a turn
    at.multiselect(key="chat_proposers").set_value(["ngram"]).run()
    assert "Draft:" not in texts(at.caption)  # the draft caption only while the draft answers
    at.chat_input(key="chat_prompt").set_value("Again: a b c a b c a b c").run()
    ok(at)
    assert len(at.session_state["chat_history"]) == 2
    assert list(at.session_state["chat_history"][1]["sides"]) == ["baseline", "ngram"]


def test_demo_chat_short_answers_busy_machine_and_sampling_are_worded(runs, tiny_target, tiny_draft, monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 60.0, 50.0))
    at = open_app(tiny_target, tiny_draft, page="demo_chat")
    at.multiselect(key="chat_proposers").set_value(["ngram"]).run()
    at.slider(key="chat_temperature").set_value(0.8).run()
    assert "same distribution" in texts(at.info) and "sampled_speculation" in texts(at.info)
    at.number_input(key="chat_max_new_tokens").set_value(8).run()
    at.chat_input(key="chat_prompt").set_value("a b a b a b").run()
    ok(at)
    turn = at.session_state["chat_history"][0]
    assert turn["explain"]["ngram"]["short"]
    assert "rough indication" in texts(at.caption) and "This machine is busy" in texts(at.caption)
    table = at.table[0].value
    assert "≈" in table.set_index("").loc["speedup"].iloc[0]


def test_demo_chat_flags_a_kernel_choice_measured_under_load(runs, tiny_target, monkeypatch):
    """Issue 65: the kernel table of a turn whose target's paths were timed on a busy machine says so."""
    import ui.resources
    from engine.generate import kernel_choice as kc

    real = kc.choose

    def measured_busy(*args, **kwargs):
        choice = real(*args, **kwargs)
        choice.other_load = 0.45
        return choice

    monkeypatch.setattr(kc, "choose", measured_busy)
    ui.resources.target.clear()  # load the target again, through the busy measurement
    try:
        at = open_app(tiny_target, page="demo_chat")
        at.number_input(key="chat_max_new_tokens").set_value(8).run()
        at.chat_input(key="chat_prompt").set_value("a b a b a b").run()
        ok(at)
        turn = at.session_state["chat_history"][0]
        assert turn["kernel_rows"] and all(r["measured"] == "under load" for r in turn["kernel_rows"])
        assert "measured under load (other processes used 45% of the CPUs)" in texts(at.warning)
        table = next(d.value for d in at.dataframe if "ms per token" in d.value.columns)
        assert set(table["measured"]) == {"under load"}
        assert "one-token step plus a 4-token verification" in texts(at.caption)
    finally:
        ui.resources.target.clear()


def test_demo_chat_without_a_draft_offers_ngram_only(runs, tiny_target):
    at = open_app(tiny_target, page="demo_chat")
    assert at.multiselect(key="chat_proposers").options == ["n-gram (prompt lookup)"]
    assert at.multiselect(key="chat_proposers").value == ["ngram"]
    captions = texts(at.caption)
    assert "n-gram only" in captions and "Draft:" not in captions and "still being trained" not in captions


def test_the_demo_chat_legend_explains_uncoloured_target_tokens(runs, tiny_target):
    at = open_app(tiny_target, page="demo_chat")
    legend = next(h.proto.body for h in at.get("html") if "dotted underline" in h.proto.body)
    assert "accepted draft token" in legend and "bonus token" in legend
    assert "no colour</span>: target token (the first token, or a step that drafted nothing)" in legend


def test_newline_tokens_stay_outside_the_coloured_spans():
    from ui.tokens import TokenMark, spec_html

    out = spec_html([TokenMark("Hi", "accepted", 1), TokenMark("\n", "accepted", 1), TokenMark("a\nb", "bonus", 2)])
    assert "\n</span>" not in out and ">\n" not in out.split("</span>", 1)[0]
    assert "↵" in out  # a newline-only token stays visible and hoverable
    assert out.count("tok-bonus") == 2  # "a" and "b" coloured, the newline between them plain
    # an answer ending in newline tokens ends as the baseline's text does: line breaks, no ↵
    end = spec_html([TokenMark("Hi", "accepted", 1), TokenMark("\n", "target", 1), TokenMark("\n\n", "bonus", 2)])
    assert "↵" not in end and end.endswith("Hi</span>\n\n\n</div>")


def test_the_kernel_paths_are_a_small_table_not_a_paragraph():
    from engine.generate.kernel_choice import Choice
    from ui.chat import kernel_rows, kernel_source, kernel_untried

    choice = Choice("gemm-gemv1", "cached", 3, "AMD EPYC", "2.13.0", False, candidates={
        "fp32": {"ms_1": 12.04, "ms_k1": 20.5, "row_exact": True},
        "gemm-gemv1": {"ms_1": 8.0, "ms_k1": 9.25, "row_exact": True},
        "bf16-native": {"skipped": "no native bf16 on this CPU"}})
    rows = kernel_rows(choice.to_dict())
    assert rows[0] == {"path": "gemm-gemv1 (chosen)", "ms per token": "8.0", "ms for 4 tokens": "9.2",
                       "ms, step + verification": "17.2", "row-exact": "yes"}
    assert len(rows) == 2 and kernel_untried(choice.to_dict()) == "Not tried: bf16-native (no native bf16 on this CPU)."
    assert kernel_source(choice.to_dict()) == "measured at first load on AMD EPYC, torch 2.13.0"


def test_kernel_timings_taken_under_load_are_flagged_and_the_rule_is_worded_as_applied():
    """Issue 65: the chosen path was not the fastest per token (the rule weighs a step plus a verification, among
    row-exact paths), and the timings were taken on a busy machine: the table and its words say both."""
    from engine.generate.kernel_choice import Choice
    from ui.chat import kernel_load_note, kernel_rows, kernel_rule

    candidates = {"fp32": {"ms_1": 223.0, "ms_k1": 420.0, "row_exact": True},
                  "fp32-routed": {"ms_1": 1616.0, "ms_k1": 1700.0, "row_exact": True},
                  "fp32-fused-packed-masked": {"ms_1": 311.0, "ms_k1": 250.0, "row_exact": True},
                  "sloppy": {"ms_1": 90.0, "ms_k1": 100.0, "row_exact": False}}
    kernel = Choice("fp32-fused-packed-masked", "cached", 3, "AMD EPYC", "2.13.0", False, candidates=candidates,
                    other_load=0.45).to_dict()
    rows = kernel_rows(kernel)
    assert {r["measured"] for r in rows} == {"under load"} and rows[0]["ms, step + verification"] == "561.0"
    rule = kernel_rule(kernel)
    assert "fastest **row-exact** path by a one-token step plus a 4-token verification" in rule
    assert rule.endswith("`fp32-fused-packed-masked`; sloppy ran faster but is not row-exact.")
    note = kernel_load_note(kernel, "smollm2-135m-instruct")
    assert "measured under load (other processes used 45% of the CPUs)" in note
    assert "python -m engine targets --prepare smollm2-135m-instruct --measure-kernels" in note
    quiet = {**kernel, "other_load": 0.03}
    assert kernel_load_note(quiet, "smollm2-135m-instruct") is None and "measured" not in kernel_rows(quiet)[0]
    none_exact = {**kernel, "path": "sloppy", "candidates": {n: {**c, "row_exact": False} for n, c in
                                                             candidates.items()}}
    assert kernel_rule(none_exact).startswith("No path is row-exact on this CPU: `auto` takes the fastest of all")


# -- data ---------------------------------------------------------------------------------------------------


def test_data_page_previews_loss_spans_and_runs_an_extraction(runs, tiny_target, tiny_dataset):
    at = open_app(tiny_target, page="data")
    at.radio(key="data_source").set_value("Local path").run()
    at.text_input(key="data_path").set_value(tiny_dataset).run()
    ok(at)
    html = texts(at.html)
    assert 'class="loss"' in html and 'class="noloss"' in html and "Count to 3." in html
    assert f"python -m engine prepare --dataset {tiny_dataset}" in texts(at.code)
    captions = texts(at.caption)
    assert "Detected shape:" in texts(at.markdown) and "Showing 3 rows (asked for 3)" in captions
    assert "on disk for 100 samples" in captions  # the extraction's size, estimated before it runs
    at.number_input(key="data_extract_samples").set_value(4)
    at.button(key="FormSubmitter:data_extract_form-Launch extraction").click().run()
    ok(at)
    job = only_job(runs, "extract")
    done = jobs.wait(job, timeout=180)
    assert done.status.state == "done", done.log_tail()
    at.run()
    ok(at)
    assert "Manifest" in texts(at.markdown)
    assert any(m.label == "samples" and m.value == "4" for m in at.metric)
    at.button(key="data_train_on_it").click().run()  # to the Train page, with `data` filled in
    ok(at)
    assert at.title[0].value == "Train"
    assert at.text_input(key="train_f_data").value == job.argv[job.argv.index("--out") + 1]


def test_data_page_upload_is_saved_for_jobs(runs, tiny_target, tiny_dataset):
    at = open_app(tiny_target, page="data")
    at.radio(key="data_source").set_value("Upload JSONL").run()
    at.file_uploader(key="data_upload").set_value(("mine.jsonl", Path(tiny_dataset).read_bytes(),
                                                   "application/json")).run()
    ok(at)
    saved = list((runs / "uploads").glob("mine-*.jsonl"))
    assert len(saved) == 1
    assert "Count to 3." in texts(at.html)
    assert not [s for s in at.selectbox if s.key == "data_split"]  # an uploaded file: no split to choose


def test_data_page_names_the_records_it_skipped(runs, tiny_target, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"nonsense": 1},
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"also": "bad"}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    at = open_app(tiny_target, page="data")
    at.radio(key="data_source").set_value("Local path").run()
    at.selectbox(key="data_split").set_value("all").run()
    at.text_input(key="data_path").set_value(str(path)).run()
    ok(at)
    assert "records 2, 4" in texts(at.caption)


# -- train --------------------------------------------------------------------------------------------------


def test_train_form_is_generated_from_the_config(runs, tiny_target):
    from engine.train.config import TrainConfig

    at = open_app(tiny_target, page="train")
    widgets = {w.key: w for w in [*at.text_input, *at.number_input, *at.checkbox, *at.selectbox]}
    from engine.algos import ALGOS
    from ui.forms import human_label
    from ui.training import COMMON_SKIP, GROUPS, algo_groups, algo_prefix

    grouped = [name for names in GROUPS.values() for name in names]
    assert set(grouped) <= set(TrainConfig.model_fields), "the form groups name fields the config does not have"
    for prefix, model in (("train_f_", TrainConfig),
                          (algo_prefix("train_f_", "eagle3"), ALGOS.get("eagle3").args_class)):
        for name, info in model.model_fields.items():
            if name in COMMON_SKIP:
                continue
            w = widgets.get(prefix + name)
            assert w is not None, f"no widget for {name}"
            assert w.label == human_label(name, info) and "_" not in w.label, w.label  # words, not field names
            assert w.help.startswith(info.description) and f"`{name}`" in w.help
    assert widgets["train_f_online_max_samples"].label == "Rows to use (online)"
    assert widgets["train_f_algo"].help == TrainConfig.model_fields["algo"].description
    args_cls = ALGOS.get("eagle3").args_class
    assert {n for names in algo_groups("eagle3").values() for n in names} == set(args_cls.model_fields)
    # nothing chosen yet: a pointer to the data fields, no warning; launch disabled
    assert not at.warning and "Choose what to train on" in texts(at.caption)
    assert at.button(key="train_launch").disabled


def test_train_form_offers_every_algorithm(runs, tiny_target):
    """Choosing any registered algorithm renders its own argument widgets, one per field."""
    from engine.algos import ALGOS
    from ui.training import algo_prefix

    at = open_app(tiny_target, page="train")
    for name in ALGOS.names():
        at.selectbox(key="train_f_algo").set_value(name).run()
        ok(at)
        keys = {w.key for w in [*at.text_input, *at.number_input, *at.checkbox, *at.selectbox]}
        missing = {f for f in ALGOS.get(name).args_class.model_fields if algo_prefix("train_f_", name) + f not in keys}
        assert not missing, f"{name}: no widget for {missing}"


def test_train_launch_watch_stop_resume(runs, tiny_target, tiny_dataset):
    at = open_app(tiny_target, page="train")
    at.button(key="train_smoke").click().run()
    at.text_input(key="train_f_online_dataset").set_value(tiny_dataset).run()
    # enough epochs and steps that the run is still going when we press Stop, on a fast machine too
    at.number_input(key="train_f_max_steps").set_value(100000).run()
    at.number_input(key="train_f_epochs").set_value(10000).run()
    ok(at)
    command = texts(at.code)
    assert f"--online-dataset {tiny_dataset}" in command and "--max-steps 100000" in command
    at.button(key="train_launch").click().run()
    ok(at)
    assert at.session_state["train_tab"] == "Watch and control runs"  # the launched run's live view opens
    job = only_job(runs, "train")
    out = Path(next(a for i, a in enumerate(job.argv) if job.argv[i - 1] == "--out"))
    wait_for(lambda: any(r.get("split") == "train" for r in jobs.read_jsonl(out / "metrics.jsonl")), timeout=180)
    at.run()
    ok(at)
    assert job.running, job.log_tail()
    assert at.selectbox(key="train_watch").value == job.id
    assert len(at.get("plotly_chart")) >= 3  # loss, accuracy per step, acceptance length
    for spec in [json.loads(c.proto.spec) for c in at.get("plotly_chart")]:
        assert spec["layout"]["xaxis"]["tickformat"] == "d" and spec["layout"]["yaxis"]["title"]["text"]
    assert any(m.label == "step" for m in at.metric)
    at.button(key="train_panel_stop").click().run()  # SIGTERM: the trainer checkpoints and exits
    stopped = jobs.wait(job, timeout=120)
    assert stopped.status.state == "stopped", stopped.log_tail()
    assert (out / "checkpoints" / "latest").is_file()
    at.run()
    ok(at)
    resume = at.button(key="train_resume")
    assert resume.label.startswith("Resume from step_")
    resume.click().run()
    ok(at)
    resumed = [j for j in jobs.list_jobs(runs) if j.kind == "train" and j.id != job.id]
    assert len(resumed) == 1 and resumed[0].argv == job.argv
    wait_for(lambda: "resumed from" in (jobs.load_job(resumed[0].dir).log_tail(200)), timeout=180)
    jobs.stop(resumed[0])
    jobs.wait(resumed[0], timeout=120)


def test_train_compare_runs_from_disk(runs, tiny_target):
    at = None
    for name, loss in (("a", 3.0), ("b", 2.0)):
        folder = runs / "train" / name
        folder.mkdir(parents=True)
        rows = [{"split": "train", "step": s, "loss": loss / s, "full_acc_0": 0.1 * s, "full_acc_1": 0.05 * s,
                 "est_acceptance_length": 1 + 0.1 * s, "tokens_per_s": 100.0} for s in range(1, 5)]
        rows.append({"split": "val", "step": 4, "loss": loss / 4, "full_acc_0": 0.4, "est_acceptance_length": 1.3})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if at is None:
            at = open_app(tiny_target, page="train")
            assert at.multiselect(key="train_compare").value == ["train/a"]
    at.run()  # a run that started after the page loaded is selected too (the user had not changed the choice)
    assert set(at.multiselect(key="train_compare").value) == {"train/a", "train/b"}
    assert len(at.get("plotly_chart")) == 3
    # each chart on a row of its own at the page's width, not a third of it beside its legend (issue 65: ~100 px)
    assert not any(col.get("plotly_chart") for col in at.columns)
    from ui import palette

    loss = next(spec for spec in _chart_specs(at) if spec["layout"]["title"]["text"] == "Loss")
    colours = {trace["name"]: (trace["line"]["color"], trace["line"].get("dash")) for trace in loss["data"]}
    runs_shown = at.multiselect(key="train_compare").value  # one colour per run, the split as the line style
    assert colours[f"{runs_shown[0]} · train"] == (palette.run_colour(0), None)
    assert colours[f"{runs_shown[1]} · train"][0] == palette.run_colour(1) != palette.run_colour(0)
    assert colours[f"{runs_shown[0]} · val"] == (palette.run_colour(0), "dot")
    # the built-in target's shipped draft: its own curve (from its model card) beside the runs
    at = open_app("smollm2-135m-instruct", page="train")
    ok(at)
    assert at.checkbox(key="train_compare_shipped").value
    acceptance = next(spec for spec in _chart_specs(at) if spec["layout"]["title"]["text"] == "Acceptance length")
    shipped = next(t for t in acceptance["data"] if t["name"].startswith("shipped draft"))
    assert len(shipped["x"]) >= 2 and shipped["line"]["color"] == palette.SHIPPED
    at.checkbox(key="train_compare_shipped").uncheck().run()
    acceptance = next(spec for spec in _chart_specs(at) if spec["layout"]["title"]["text"] == "Acceptance length")
    assert not any(t["name"].startswith("shipped draft") for t in acceptance["data"])


def test_train_smoke_preset_time_is_measured(runs, tiny_target):
    from ui import training

    assert training.smoke_duration("eagle3") is None  # no smoke run here yet: no figure from another machine
    assert training.smoke_summary("eagle3") == f"Time: {training.SMOKE_FIRST}."
    assert training.SMOKE_FIRST.startswith("first run: measuring")
    argv = ["train", "--online-dataset", "sharegpt", "--online-max-samples", "24", "--max-steps", "12",
            "--tokens-per-batch", "256"]
    now = time.time()
    for name, extra, took in (("e", [], 42.0), ("d", ["--algo", "dflash"], 99.0), ("big", ["--max-steps", "13"], 5)):
        job = runs / f"20000101-00000{len(name)}_train_{name}"
        job.mkdir(parents=True)
        (job / "job.json").write_text(json.dumps({"kind": "train", "argv": (argv + extra) if name != "big" else
                                                  argv[:5] + ["--max-steps", "400", "--tokens-per-batch", "256"],
                                                  "created": now - 1000, "pid": None, "pgid": None}))
        (job / "status.json").write_text(json.dumps({"state": "done", "started": now - 1000 + 3,
                                                     "updated": now - 1000 + took}))
    seconds, where = training.smoke_duration("eagle3")
    assert round(seconds) == 42 and "your last smoke run here (20000101-000001_train_e)" == where
    assert round(training.smoke_duration("dflash")[0]) == 99
    at = open_app(tiny_target, page="train")
    assert "Measured: 42 s on your last smoke run here" in at.button(key="train_smoke").help


# -- convert ------------------------------------------------------------------------------------------------


def test_convert_detects_research_checkpoint_and_does_not_fake_a_conversion(runs, tiny_target, tiny_draft, tmp_path):
    src = research_checkpoint(tiny_draft, tmp_path / "research")
    at = open_app(tiny_target, page="convert")
    at.text_input(key="convert_path").set_value(str(src)).run()
    ok(at)
    assert "EAGLE-3 SpecForge checkpoint" in texts(at.markdown)  # midlayer.* with its own embed_tokens
    mapping = at.dataframe[0].value
    row = mapping[mapping["source key"] == "midlayer.self_attn.q_proj.weight"].iloc[0]
    assert row["speculators key"] == "layers.0.self_attn.q_proj.weight"
    from engine.cli import COMMANDS

    if "convert" not in COMMANDS:
        assert "Converter not available yet" in texts(at.warning)
        assert not list((runs / "converted").glob("*")) if (runs / "converted").exists() else True
    assert f"python -m engine convert {src}" in texts(at.code)


def test_convert_exports_the_active_draft_to_gguf_or_says_why_llama_cpp_cannot(runs, tiny_target, tiny_draft,
                                                                              tmp_path):
    at = open_app(tiny_target, tiny_draft, page="convert")
    ok(at)
    at.session_state["gguf_draft_type"] = "q8_0"
    at.run()
    line = next(c.value for c in at.code if "python -m engine export" in c.value)
    assert line.startswith(f"python -m engine export {tiny_draft} --out ") and "--draft-type q8_0" in line
    assert at.button(key="gguf_go") is not None
    two = tmp_path / "two-layers"
    two.mkdir()
    cfg = json.loads((Path(tiny_draft) / "config.json").read_text())
    (two / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [1, 2]}))
    at = open_app(tiny_target, str(two), page="convert")
    assert any("llama.cpp cannot run this draft: it reads 2 target layers" in e.value for e in at.error)
    assert not [c for c in at.code if "python -m engine export" in c.value]


def _failed_convert_job(runs: Path, src: str, name: str) -> None:
    """A finished, failed conversion job of `src` as the CLI leaves it (what, then Fix)."""
    job = runs / f"20000101-00000{len(name)}_convert_{name}"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"kind": "convert", "argv": ["convert", src, "--out", str(job / "o")],
                                              "created": time.time() - 60, "pid": None, "pgid": None}))
    (job / "status.json").write_text(json.dumps({
        "state": "failed", "message": f"{src}: no model.safetensors in the folder, and a long explanation that has "
        "to wrap inside its box rather than run off the page\nFix: save the weights as safetensors"}))


def test_convert_shows_only_this_checkpoints_jobs_and_failures_readably(runs, tiny_target, tiny_draft, tmp_path):
    src = research_checkpoint(tiny_draft, tmp_path / "research")
    _failed_convert_job(runs, str(tmp_path / "another-checkpoint"), "other")
    at = open_app(tiny_target, tiny_draft, page="convert")
    at.text_input(key="convert_path").set_value(str(tiny_draft)).run()  # already in the speculators format
    ok(at)
    assert "nothing to convert" in texts(at.success)
    assert not at.error, texts(at.error)  # the unrelated failed job is not this page's failure
    assert not [box for box in at.selectbox if box.key == "convert_watch"]
    assert "convert_other" not in texts(at.markdown)
    _failed_convert_job(runs, str(src), "this")
    at.text_input(key="convert_path").set_value(str(src)).run()
    ok(at)
    errors, hints = texts(at.error), texts(at.info)
    assert "convert failed:" in errors and "no model.safetensors in the folder" in errors and "Fix:" not in errors
    assert "What to do:** save the weights as safetensors" in hints
    assert len(at.selectbox(key="convert_watch").options) == 1  # this checkpoint's job only


def test_convert_accepts_a_zip_upload_validates_and_offers_the_zip(runs, tiny_target, tiny_draft):
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in Path(tiny_draft).iterdir():
            zf.write(f, f"draft/{f.name}")
    at = open_app(tiny_target, page="convert")
    at.file_uploader(key="convert_upload").set_value([("draft.zip", buf.getvalue(), "application/zip")]).run()
    ok(at)
    assert "speculators format" in texts(at.markdown)
    assert "nothing to convert" in texts(at.success)
    assert "vLLM 0.33: loads it" in texts(at.markdown)
    assert at.download_button(key="convert_download") is not None


def test_convert_zip_helper_round_trips(tiny_draft, tmp_path):
    import io
    import zipfile

    from ui.convert import zip_folder

    names = zipfile.ZipFile(io.BytesIO(zip_folder(tiny_draft))).namelist()
    assert sorted(names) == ["config.json", "model.safetensors"]


# -- config builder -------------------------------------------------------------------------------------------


def test_config_builder_form_and_json_stay_in_sync_with_live_validation(runs, tiny_target, tiny_draft):
    at = open_app(tiny_target, tiny_draft, page="config_builder")
    k_key = "builder_f_speculators_config_proposal_methods_0_speculative_tokens"
    assert at.number_input(key=k_key).value == 3
    # form -> JSON, and vLLM's verdict on the field
    at.number_input(key=k_key).set_value(0).run()
    ok(at)
    cfg = json.loads(at.text_area(key="builder_json").value)
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 0
    assert "vLLM 0.33: rejects" in texts(at.markdown)
    assert "greater than zero" in texts(at.caption)
    assert at.number_input(key=k_key).label == "speculative tokens"  # words that wrap, the JSON path in the help
    findings = at.table[0].value  # a static table: its cells wrap inside the column
    fields = [f.replace("\u200b", "") for f in findings["field"]]
    assert "speculators_config.proposal_methods[0].speculative_tokens" in fields
    assert any("greater than zero" in v for v in findings["vLLM says"])
    # JSON -> form, and our own verdict on the field
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 4
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 1, 2]
    at.text_area(key="builder_json").set_value(json.dumps(cfg)).run()
    ok(at)
    assert at.number_input(key=k_key).value == 4
    assert at.text_input(key="builder_f_eagle_aux_hidden_state_layer_ids").value == "1, 1, 2"
    assert "duplicate layer ids" in texts(at.caption)
    assert "vLLM 0.33: loads it" in texts(at.markdown)
    # the derived config and both command lines follow the edits
    assert '"num_speculative_tokens": 4' in texts(at.json) or "num_speculative_tokens" in texts(at.json)
    at.text_input(key="builder_draft_dir").set_value("/srv/my-draft").run()
    assert "vllm serve" in texts(at.code) and "/srv/my-draft" in texts(at.code)
    # broken JSON: a message, the last valid config stays
    at.text_area(key="builder_json").set_value('{"speculators_model_type": ').run()
    ok(at)
    assert "Invalid JSON" in texts(at.error)
    assert at.number_input(key=k_key).value == 4
    assert at.download_button(key="builder_download") is not None


def test_config_builder_checks_more_speculative_fields_and_puts_them_in_the_commands(runs, tiny_target, tiny_draft):
    at = open_app(tiny_target, tiny_draft, page="config_builder")
    more = at.text_input(key="builder_spec_fields")
    more.set_value('{"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0}').run()
    ok(at)
    assert any(w.value.startswith("LOSSY: rejection_sample_method='synthetic'") for w in at.warning)
    lines = [c.value for c in at.code if c.value.startswith("vllm serve")]
    assert lines and all('"rejection_sample_method": "synthetic"' in line for line in lines)
    at.text_input(key="builder_spec_fields").set_value('{"synthetic_acceptance_length": 2.0}').run()
    ok(at)
    assert any("vLLM would refuse it" in e.value and "synthetic_acceptance_length" in e.value for e in at.error)
    at.text_input(key="builder_spec_fields").set_value("[1]").run()
    ok(at)
    assert any("must be a JSON object" in e.value for e in at.error)
    at.text_input(key="builder_spec_fields").set_value("").run()
    ok(at)
    assert not at.error and not any("LOSSY" in w.value for w in at.warning)


def test_config_builder_hints_k_mask_token_and_writes_eps_as_written(runs, tiny_target, tiny_draft):
    from engine.algos import ALGOS, algorithm_names

    at = open_app(tiny_target, tiny_draft, page="config_builder")
    k_key = "builder_f_speculators_config_proposal_methods_0_speculative_tokens"
    assert not at.warning
    at.number_input(key=k_key).set_value(6).run()
    assert "k = 6 is more than the 3 draft positions" in texts(at.warning)  # past what it was trained for
    for algorithm in algorithm_names():  # the registry's list, as the page offers it
        cls = ALGOS.get(algorithm).config_class
        at.selectbox(key="builder_new_algo").set_value(algorithm).run()
        at.button(key="builder_new").click().run()
        ok(at)
        text = at.text_area(key="builder_json").value
        assert "e-06" not in text or "9.99999" not in text  # no float32 artefacts
        assert ("Mask token suggested" in texts(at.caption)) == cls.uses_mask_token, algorithm
        assert not at.warning  # a fresh config has no trained k to exceed


def test_config_builder_shows_a_loaded_drafts_float32_eps_as_written(runs, tiny_target):
    import json

    from engine.algos.shipped import default_draft

    shipped = default_draft("smollm2-135m-instruct")
    assert "9.99999974" in (shipped / "config.json").read_text()  # saved from a float32 value
    at = open_app(tiny_target, str(shipped), page="config_builder")
    ok(at)
    [eps] = [w for w in at.number_input if w.key.endswith("rms_norm_eps")]
    assert eps.value == 1e-05
    assert json.loads(at.text_area(key="builder_json").value)["transformer_layer_config"]["rms_norm_eps"] == \
        9.999999747378752e-06  # the JSON keeps the file's value until the user edits the field


def test_tidy_floats_writes_float32_values_as_written():
    from ui.builder import tidy_floats

    assert tidy_floats({"a": [9.999999747378752e-06, 0.1, 1e-6]}) == {"a": [1e-05, 0.1, 1e-6]}
    assert tidy_floats(3) == 3 and tidy_floats(0.30000001192092896) == 0.3


def test_config_builder_new_config_for_each_algorithm(runs, tiny_target):
    at = open_app(tiny_target, page="config_builder")
    for algorithm in ("dflash", "dspark", "peagle", "eagle3"):
        at.selectbox(key="builder_new_algo").set_value(algorithm).run()
        at.button(key="builder_new").click().run()
        ok(at)
        assert json.loads(at.text_area(key="builder_json").value)["speculators_model_type"] == algorithm
        assert at.selectbox(key="builder_f_speculators_model_type").value == algorithm


# -- benchmarks -----------------------------------------------------------------------------------------------

BENCH = {
    "methods": {
        "baseline": {"mean_acceptance_length": None, "per_position_acceptance": [], "tokens_per_s": 40.0,
                     "speedup": 1.0, "identical_to_baseline": True},
        "draft": {"mean_acceptance_length": 2.4, "per_position_acceptance": [0.8, 0.5, 0.2], "tokens_per_s": 70.0,
                  "speedup": 1.75, "identical_to_baseline": True, "speedup_ceiling": 2.1},
        "ngram": {"mean_acceptance_length": 1.3, "per_position_acceptance": [0.2, 0.08, 0.02], "tokens_per_s": 44.0,
                  "speedup": 1.1, "identical_to_baseline": True, "speedup_ceiling": 1.2},
        "hf_assisted": {"skipped": "no assistant", "mean_acceptance_length": None, "per_position_acceptance": [],
                        "tokens_per_s": 0.0, "speedup": 0.0, "identical_to_baseline": False},
    },
    "cost_curve": {"1": 1.0, "4": 1.14}, "k": 3, "num_prompts": 2, "max_new_tokens": 16, "temperature": 0.0,
    "target": "tiny", "draft": "d", "backend": "transformers", "device": "cpu",
}


def _chart_specs(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_benchmarks_page_opens_on_the_shipped_results_with_readable_charts(runs, tiny_target):
    from ui import bench as bench_ui

    shipped = bench_ui.shipped_results()
    assert shipped, "benchmarks/results/*.json ship with the project"
    at = open_app(tiny_target, page="benchmarks")
    sel = at.selectbox(key="bench_result")
    assert sel.value == bench_ui.freshest_for_this_machine(shipped) and sel.value.startswith("shipped · ")
    for key in shipped:  # every shipped result: titled charts with units, no None anywhere
        at.selectbox(key="bench_result").set_value(key).run()
        ok(at)
        caption = texts(at.caption)
        assert "None" not in caption and " prompts × up to " in caption
        assert " · measured on " in caption  # which machine (CPU) and when, or that the record does not say
        where = bench_ui.provenance(key, shipped)
        assert not where.startswith("this machine")  # a shipped record never ran here (issue 65)
        here = bench_ui.of_this_kind(where)
        assert here != any("not known to be from this machine" in w for w in texts(at.warning).splitlines())
        specs = _chart_specs(at)
        assert len(specs) >= 3
        for spec in specs:
            layout = spec["layout"]
            assert layout["title"]["text"] and layout["title"]["subtitle"]["text"]
            assert layout["yaxis"]["title"]["text"] not in ("", "×")
            assert "prompt" in layout["title"]["subtitle"]["text"] or "prompt" in layout["title"]["text"]
        table = at.dataframe[0].value
        cells = [str(v) for v in table.to_numpy().ravel()]
        assert "None" not in cells and "nan" not in cells
        assert not any(c.count(".") == 1 and len(c.split(".")[1].rstrip("×%")) > 2 for c in cells)
        assert at.get("download_button")
        if "vllm" in key and any(r.get("identical_to_baseline") is False
                                 for r in bench_ui.load(shipped[key])["methods"].values()):
            assert any("bf16 drift" in c for c in table["identical to baseline"])
            assert "bf16" in texts(at.info)
        # per-prompt drill-down: one row per prompt
        n = bench_ui.num_prompts(bench_ui.load(shipped[key]))
        prompt_tables = [d.value for d in at.dataframe if "prompt" in d.value.columns]
        if prompt_tables:
            assert len(prompt_tables[0]) == n


def test_benchmarks_page_shows_the_recipe_curve_checkpoint_heatmap_and_k_sweep(runs, tiny_target):
    at = open_app(tiny_target, page="benchmarks")
    assert at.selectbox(key="bench_recipe").value.startswith("shipped · ")  # the shipped draft's model card
    specs = {spec["layout"]["title"]["text"]: spec for spec in _chart_specs(at)}
    curve = specs["Acceptance length against training tokens"]
    assert len(curve["data"][0]["x"]) >= 2 and curve["layout"]["xaxis"]["title"]["text"] == "training tokens seen"
    heat = specs["Acceptance per position and checkpoint"]["data"][0]
    assert len(heat["y"]) == len(curve["data"][0]["x"]) and len(heat["x"]) >= 1  # checkpoint × position
    sweep = specs["Acceptance length by k"]["data"][0]
    assert sweep["x"][:2] == [1, 2] and specs["Speedup by k"]["data"][0]["y"]
    tables = [d.value for d in at.dataframe]
    assert any("training tokens" in t.columns for t in tables) and any("k" in t.columns for t in tables)
    for chart in at.get("plotly_chart"):  # every chart carries a visible PNG export button
        config = json.loads(chart.proto.config)
        assert config["displayModeBar"] is True and config["modeBarButtons"] == [["toImage"]]
        assert config["toImageButtonOptions"]["format"] == "png" and config["toImageButtonOptions"]["filename"]


def test_recipe_results_from_a_work_folder_and_from_a_card(tmp_path):
    from engine.recipes.model_card import curve_from_card, sweep_from_card
    from ui import recipes

    (tmp_path / "curve.json").write_text(json.dumps([{"step": 5, "training_tokens": 1234.0,
                                                      "mean_acceptance_length": 1.3333,
                                                      "per_position_acceptance": [0.3, 0.1]}]))
    found = recipes.from_work("tiny", tmp_path)
    assert found.curve[0]["step"] == 5 and not found.sweep and not found.rounded
    assert recipes.curve_rows(found) == [{"step": 5, "training tokens": 1234, "mean acceptance length": 1.33,
                                          "per-position acceptance": "0.30, 0.10"}]
    assert recipes.from_work("empty", tmp_path / "nothing") is None
    (tmp_path / "sweep.json").write_text(json.dumps({"command": "python -m engine recipe tiny --only sweep",
                                                     "rows": [{"k": 2, "speedup": 1.1}]}))  # rows beside provenance
    assert recipes.from_work("tiny", tmp_path).sweep == [{"k": 2, "speedup": 1.1}]
    card = ("### Acceptance length against training tokens\n| step | training tokens | a | b |\n|---|---|---|---|\n"
            "| 50 | 194k | 1.18 | 0.15, 0.03 |\n\n### Number of speculative tokens (k)\n"
            "| k | a | b | speedup | identical |\n|---|---|---|---|---|\n| 2 | 1.45 | 0.33, 0.12 | 0.73× | yes |\n")
    assert curve_from_card(card) == [{"step": 50, "training_tokens": 194000.0, "mean_acceptance_length": 1.18,
                                      "per_position_acceptance": [0.15, 0.03]}]
    assert sweep_from_card(card) == [{"k": 2, "mean_acceptance_length": 1.45, "per_position_acceptance": [0.33, 0.12],
                                      "speedup": 0.73, "identical_to_baseline": True}]


def test_benchmarks_page_plots_a_result(runs, tiny_target):
    (runs / "bench").mkdir(parents=True)
    (runs / "bench" / "bench-1.json").write_text(json.dumps(BENCH))
    at = open_app(tiny_target, page="benchmarks")
    assert at.selectbox(key="bench_result").value == "bench-1.json"  # your run (made here) before shipped records
    at.selectbox(key="bench_result").set_value("bench-1.json").run()
    ok(at)
    specs = [s for s in _chart_specs(at) if "model card" not in s["layout"]["title"]["subtitle"]["text"]
             and "by answer position" not in s["layout"]["title"]["text"]]  # the offline evaluations' charts
    assert len(specs) == 3  # the result's own charts (the recipe's follow them)
    speed = next(s for s in specs if "Speedup vs" in s["layout"]["title"]["text"])
    ceiling = next(t for t in speed["data"] if "ceiling" in t.get("name", ""))
    assert ceiling["y"] == [2.1, 1.2]
    assert "2 prompts" in speed["layout"]["title"]["subtitle"]["text"]
    assert any("draft" in d.value["method"].tolist() for d in at.dataframe)
    assert "target `tiny`" in texts(at.caption) and "None" not in texts(at.caption)


def test_benchmarks_page_flags_speeds_and_a_kernel_choice_measured_under_load(runs, tiny_target):
    """Issue 65: a result whose rounds all ran under load, and whose kernel path was chosen under load, says so."""
    loaded = {**BENCH, "label": "under load: no round ran on a quiet machine; the figures are from loaded rounds",
              "kernel": {"path": "fp32", "other_load": 0.4, "candidates": {}}}
    (runs / "bench").mkdir(parents=True)
    (runs / "bench" / "bench-1.json").write_text(json.dumps(loaded))
    at = open_app(tiny_target, page="benchmarks")
    ok(at)
    warnings = texts(at.warning)
    assert "Speeds under load: no round ran on a quiet machine" in warnings
    assert "kernel path (fp32) was chosen from timings measured under load (other processes used 40%" in warnings
    (runs / "bench" / "bench-1.json").write_text(json.dumps(BENCH))
    at = open_app(tiny_target, page="benchmarks")
    assert "under load" not in texts(at.warning)


def test_benchmarks_per_prompt_rows_heatmap_and_csv():
    from ui import bench as bench_ui

    result = json.loads(json.dumps(BENCH))
    result["prompt_previews"] = ["first prompt", "second prompt"]
    for name, taus in (("baseline", [None, None]), ("draft", [2.5, 1.5]), ("ngram", [1.2, 1.4])):
        result["methods"][name]["per_prompt"] = [
            {"tokens": 16, "seconds": 0.5 if name == "baseline" else 0.25, "mean_acceptance_length": t,
             "per_position_acceptance": [] if t is None else [0.9, 0.5, 0.1]} for t in taus]
    rows = bench_ui.per_prompt_rows(result)
    assert [r["text"] for r in rows] == ["first prompt", "second prompt"]
    assert rows[0]["draft · acceptance length"] == 2.5 and rows[0]["draft · speedup"] == 2.0
    z, labels = bench_ui.heatmap_data(result, "draft")
    assert labels == ["prompt 1", "prompt 2"] and z[0] == [0.9, 0.5, 0.1]
    csv = bench_ui.to_csv(bench_ui.table_raw(result))
    assert csv.splitlines()[0].startswith("method,") and "draft,,2.4," in csv
    from ui import charts

    assert "spread" in charts.bench_figures(result)
    assert charts.acceptance_heatmap(z, labels, "draft").layout.height >= 300  # drawn (height given once)


def test_benchmarks_page_launches_bench_as_a_job(runs, tiny_target):
    at = open_app(tiny_target, page="benchmarks")
    at.multiselect(key="bench_methods").set_value(["baseline", "ngram"])
    at.number_input(key="bench_num_prompts").set_value(1)
    at.number_input(key="bench_max_new_tokens").set_value(4)
    at.button(key="FormSubmitter:bench_form-Launch benchmark").click().run()
    ok(at)
    job = only_job(runs, "bench")
    assert job.argv[:3] == ["bench", "--target", tiny_target] and "--json" in job.argv
    done = jobs.wait(job, timeout=240)
    assert done.status.state == "done", done.log_tail()
    at.run()
    ok(at)
    assert at.selectbox(key="bench_result").value == job.id  # a run that finished is shown at once
    assert len(at.get("plotly_chart")) >= 3


# -- serve ----------------------------------------------------------------------------------------------------


class _FakeVllm(BaseHTTPRequestHandler):
    """Just enough of vLLM's OpenAI server and /metrics for the Serve page."""

    def log_message(self, *args):
        pass

    def _send(self, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/metrics":
            self._send("\n".join([
                "vllm:spec_decode_num_drafts_total{model_name=\"m\"} 10",
                "vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 30",
                "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 15",
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 8",
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 5",
                "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"2\"} 2",
            ]) + "\n", "text/plain")
        elif self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "served-model"}]}))
        else:
            self._send("{}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        answer = "echo: " + body["messages"][-1]["content"]
        self._send(json.dumps({"choices": [{"message": {"content": answer}, "finish_reason": "stop"}],
                               "usage": {"completion_tokens": 3, "prompt_tokens": 5}}))


def test_serve_page_chats_and_charts_acceptance_from_metrics(runs, tiny_target):
    import os

    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    job_dir = runs / "20000101-000000_serve_1234"
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"kind": "serve", "argv": ["serve", "--port", "1234"],
                                                  "created": time.time(), "pid": None, "pgid": None}))
    (job_dir / "vllm.log").write_text("$ /venv/bin/python -m vllm.entrypoints.openai.api_server --model /drafts/x\n")
    (job_dir / "status.json").write_text(json.dumps({
        "state": "running", "message": f"serving on {url}", "pid": os.getpid(),
        "result": {"url": url, "ready": True, "vllm_serve": "vllm serve /drafts/x",
                   "log": str(job_dir / "vllm.log")}}))
    try:
        at = open_app(tiny_target, page="serve")
        assert "vllm serve /drafts/x" in texts(at.code)
        assert "-m vllm.entrypoints.openai.api_server --model /drafts/x" in texts(at.code)
        assert any(m.label == "tokens per step" and m.value == "2.50" for m in at.metric)
        assert at.metric and all(len(m.label) <= 15 for m in at.metric)  # three narrow columns: labels not cut
        spec = json.loads(at.get("plotly_chart")[0].proto.spec)
        assert spec["data"][0]["y"] == [0.8, 0.5, 0.2]
        at.chat_input(key="serve_chat_prompt").set_value("hi there").run()
        ok(at)
        assert "echo: hi there" in texts(at.markdown)
    finally:
        server.shutdown()
        (job_dir / "status.json").write_text(json.dumps({"state": "stopped"}))


def test_serve_page_without_vllm_offers_the_install(runs, tiny_target, monkeypatch):
    import ui.serving

    monkeypatch.setattr(ui.serving, "vllm_env", lambda: None)
    at = open_app(tiny_target, page="serve")
    assert "vLLM is not installed yet" in texts(at.warning)
    assert at.button(key="serve_install") is not None
    assert "python -m engine serve --install-only" in texts(at.code)


def test_serve_page_takes_more_speculative_fields_and_says_what_is_wrong_with_them(runs, tiny_target, tiny_draft,
                                                                                  monkeypatch):
    import ui.serving
    from engine.serve.venv import VllmEnv

    monkeypatch.setattr(ui.serving, "vllm_env", lambda: VllmEnv(Path("/venv"), "cpu", "0.32.0", "2.13.0+cpu"))
    at = open_app(tiny_target, tiny_draft, page="serve")
    at.session_state["serve_spec_fields"] = '{"rejection_sample_method": "block"}'  # the form's value once sent
    at.run()
    ok(at)
    assert """--speculative-fields '{"rejection_sample_method": "block"}'""" in texts(at.code)
    at.session_state["serve_spec_fields"] = "{rejection_sample_method: block}"
    at.run()
    ok(at)
    assert any("Cannot serve with these values: speculative_fields is not JSON" in e.value for e in at.error)
    assert "--speculative-fields" not in texts(at.code)


@pytest.mark.parametrize("native", [False, True])
def test_serve_page_defaults_to_float32_where_bf16_is_emulated_and_says_why(runs, tiny_target, monkeypatch, native):
    """Issue 65: vLLM's CPU build on a CPU without native bf16 serves float32 by default, with a line on what bf16
    costs there; with native bf16 (or on a GPU) bfloat16 stays the default, with no note."""
    import engine.cpu
    import ui.serving
    from engine.serve.options import default_dtype
    from engine.serve.venv import VllmEnv

    monkeypatch.setattr(ui.serving, "vllm_env", lambda: VllmEnv(Path("/venv"), "cpu", "0.32.0", "2.13.0+cpu"))
    monkeypatch.setattr(engine.cpu, "native_bf16", lambda *args, **kwargs: native)
    at = open_app(tiny_target, page="serve")
    expected = "bfloat16" if native else "float32"
    assert at.selectbox(key="serve_dtype").value == expected and default_dtype("cpu") == expected
    assert default_dtype("cuda") == "bfloat16"
    assert f"--dtype {expected}" in texts(at.code) or native
    note = "no native bf16, so bfloat16 would be emulated (slower) and its answers may differ from the in-process fp32"
    assert (note in texts(at.caption)) is not native
    if not native:
        at.session_state["serve_dtype"] = "bfloat16"  # the form's value once sent
        at.run()
        ok(at)
        assert "bfloat16 is emulated here, slower than float32" in texts(at.caption)


def test_serve_page_builds_a_llama_cpp_command_and_offers_the_build(runs, tiny_target, tiny_draft, monkeypatch):
    import ui.serving

    monkeypatch.setattr(ui.serving, "llamacpp_build", lambda: None)
    at = open_app(tiny_target, tiny_draft, page="serve")
    at.radio(key="serve_engine").set_value("llama.cpp").run()
    ok(at)
    assert "llama.cpp is not built on this machine yet" in texts(at.warning)
    assert at.button(key="serve_llamacpp_build") is not None
    at.session_state["serve_lc_pmin"] = 0.6
    at.session_state["serve_lc_ngram"] = "ngram-mod"
    at.session_state["serve_lc_target"] = "shipped"
    at.run()
    ok(at)
    line = next(c.value for c in at.code if "--engine llama.cpp" in c.value)
    assert "--p-min 0.6" in line and "--ngram ngram-mod" in line and "--gguf-target shipped" in line
    assert f"--draft {tiny_draft}" in line


# -- jobs -------------------------------------------------------------------------------------------------------


def test_jobs_page_rebuilds_the_list_from_disk(runs, tiny_target):
    job = jobs.launch(["targets", "--prepare", "none", "--json"])
    assert jobs.wait(job, timeout=120).status.state == "done"
    at = open_app(tiny_target, page="jobs")
    assert job.id in at.dataframe[0].value["job"].tolist()
    assert "python -m engine targets --prepare none --json" in texts(at.code)
    # a new session (a browser refresh, an app restart) sees the same list
    again = open_app(tiny_target, page="jobs")
    assert job.id in again.dataframe[0].value["job"].tolist()


# -- helpers -----------------------------------------------------------------------------------------------------


def test_token_text_gives_every_token_its_exact_piece(tiny_target):
    from transformers import AutoTokenizer

    from ui.tokens import TokenText

    tok = AutoTokenizer.from_pretrained(tiny_target)
    text = "héllo wörld — ünïcode ✓ 1 2 3"
    ids = tok(text, add_special_tokens=False).input_ids
    tt = TokenText(tok)
    for i in ids:
        tt.add(i)
    assert tt.text == tok.decode(ids, skip_special_tokens=True) == text
    assert len(tt.pieces) == len(ids)


def test_train_argv_puts_tuples_in_yaml_and_skips_defaults(tmp_path):
    from engine.train.config import TrainConfig
    from ui.training import train_argv

    cfg = TrainConfig(online_dataset="sharegpt", out=str(tmp_path), betas=(0.8, 0.9), max_steps=5, fc_norm=True,
                      norm_before_fc=False)
    argv, yaml_fields = train_argv(cfg)
    assert argv[0] == "train" and "--max-steps" in argv and "--fc-norm" in argv and "--no-norm-before-fc" in argv
    assert "--lr" not in argv and "--betas" not in argv
    assert yaml_fields == {"betas": [0.8, 0.9]}


def test_builder_paths():
    from ui.builder import MISSING, get_path, set_path

    cfg: dict = {}
    set_path(cfg, "speculators_config.proposal_methods[0].speculative_tokens", 3)
    assert cfg == {"speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]}}
    assert get_path(cfg, "speculators_config.proposal_methods[0].speculative_tokens") == 3
    assert get_path(cfg, "speculators_config.verifier.name_or_path") is MISSING


def test_data_page_runs_a_regeneration_and_offers_its_output(runs, tiny_target, tiny_dataset):
    at = open_app(tiny_target, page="data")
    at.radio(key="data_source").set_value("Local path").run()
    at.text_input(key="data_path").set_value(tiny_dataset).run()
    at.number_input(key="data_regen_samples").set_value(2)
    at.number_input(key="data_regen_new_tokens").set_value(4)
    at.button(key="FormSubmitter:data_regen_form-Launch regeneration").click().run()
    ok(at)
    job = only_job(runs, "regenerate")
    assert "--max-new-tokens" in job.argv and job.argv[job.argv.index("--max-new-tokens") + 1] == "4"
    done = jobs.wait(job, timeout=180)
    assert done.status.state == "done", done.log_tail()
    at.run()
    at.button(key="data_use_regen").click().run()
    ok(at)
    produced = job.argv[job.argv.index("--out") + 1]
    assert at.session_state["data_path"] == produced and Path(produced).is_file()


def test_pages_go_through_ui_and_app_py_only_frames():
    """pages/ -> ui/ -> engine/: pages import streamlit, ui and the standard library, never the engine directly."""
    import ast
    import sys

    allowed = {"streamlit", "ui", "__future__"} | set(sys.stdlib_module_names)
    for f in [*(ROOT / "pages").glob("*.py"), ROOT / "app.py"]:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                assert name.split(".")[0] in allowed, f"{f.name} imports {name}"
    assert "st.cache_resource" not in "".join(f.read_text() for f in (ROOT / "pages").glob("*.py"))
    caching = [f.name for f in (ROOT / "ui").glob("*.py") if "cache_resource" in f.read_text()]
    assert caching == ["resources.py"], caching


def test_every_command_the_app_builds_is_accepted_by_the_cli(tmp_path):
    """The pages' commands parse with `python -m engine`'s own parser (the CLI mirrors the app)."""
    from engine.cli import build_parser
    from engine.train.config import TrainConfig
    from ui import bench, data, serving, training

    parser = build_parser()
    cfg = TrainConfig(online_dataset="sharegpt", out=str(tmp_path / "o"), max_steps=5, aux_layer_ids=[2, 15, 27],
                      fc_norm=True, norm_before_fc=False, draft_vocab_size=8192, lr=5e-4)
    argv, _ = training.train_argv(cfg)
    args = parser.parse_args(argv)
    assert args.aux_layer_ids == [2, 15, 27] and args.fc_norm is True and args.norm_before_fc is False
    from engine.commands.train import train_overrides

    assert TrainConfig(**train_overrides(args)) == cfg  # common fields and the algorithm's own arguments
    commands = [
        data.prepare_argv({"dataset": "sharegpt", "target": "t", "split": "train", "max_samples": 3, "preview": 3,
                           "max_length": 512}),
        data.regenerate_argv({"dataset": "sharegpt", "target": "t", "out": "o.jsonl", "split": "train",
                              "max_samples": 5, "max_new_tokens": 8, "temperature": 0.0, "batch_size": 2,
                              "max_turns": 1}),
        data.extract_argv({"dataset": "sharegpt", "target": "t", "out": "out", "split": "val", "max_samples": None,
                           "max_length": 256, "layers": "2, 15,27,30", "algo": "eagle3", "dtype": "bf16",
                           "batch_size": 4}),
        data.extract_argv({"dataset": "sharegpt", "target": "t", "out": "out", "split": "train", "max_samples": 3,
                           "max_length": 256, "layers": "", "algo": "dflash", "dtype": "fp32", "batch_size": 4}),
        bench.bench_argv({"target": "t", "draft": "d", "prompts": "sharegpt", "num_prompts": 2, "max_new_tokens": 8,
                          "k": 3, "temperature": 0.0, "methods": ["baseline", "draft", "ngram"],
                          "backend": "transformers"}, "r.json"),
        serving.serve_argv({"draft": "d", "target": None, "k": 4, "form": "auto", "port": 8123,
                            "max_model_len": 2048, "dtype": "bfloat16"}),
        serving.serve_argv({"draft": "d", "target": None, "k": None, "form": "auto", "port": 8123,
                            "max_model_len": 2048, "dtype": "bfloat16", "per_request_spec_decode_metrics": "detailed"}),
        serving.serve_argv({"draft": None, "target": "t", "k": 3, "form": "auto", "port": 8123, "max_model_len": 2048,
                            "dtype": "float32", "per_request_spec_decode_metrics": "detailed"}),
    ]
    for argv in commands:
        parser.parse_args(argv)
    assert commands[-2][-2:] == ["--per-request-spec-decode-metrics", "detailed"]  # the Serve page's metrics field
    layered, by_algo, no_draft = commands[2], commands[3], commands[-1]
    assert "2,15,27,30" in layered and "--algo" not in layered and "--layers" not in by_algo and "dflash" in by_algo
    assert "--no-draft" in no_draft and not {"--k", "--per-request-spec-decode-metrics"} & set(no_draft)
    assert "--draft" not in bench.bench_argv({"draft": "d", "methods": ["baseline", "ngram"]}, "r.json")
