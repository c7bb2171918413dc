"""Issue 62 in the app: the draft's confidence cut (p-min) and draft + n-gram, where a user decodes and measures."""

from __future__ import annotations

import shlex

import pytest
import torch

from testkit.app import ok, only_job, open_app, texts


@pytest.fixture(scope="module")
def tiny_dflash(tiny_target, tmp_path_factory) -> str:
    """A DFlash draft of the tiny target: a block drafter, which takes no p-min."""
    from engine.algos.dflash.args import DFlashArgs
    from engine.algos.dflash.io import build_dflash, save_dflash
    from engine.targets.loading import load_target

    target = load_target(tiny_target)
    draft = build_dflash(target, DFlashArgs(num_layers=1, block_size=4, draft_vocab_size=160),
                         aux_layer_ids=[1, 2, 3], token_counts=torch.arange(target.vocab_size).flip(0))
    return str(save_dflash(draft, tmp_path_factory.mktemp("app-dflash") / "tiny-dflash", dtype=torch.float32))


def _parses(argv: list[str]):
    from engine.cli import build_parser

    return build_parser().parse_args(argv)


# -- demo chat ------------------------------------------------------------------------------------------------


def test_demo_chat_runs_draft_ngram_with_a_p_min_and_says_who_proposed_each_step(runs, tiny_target, tiny_draft,
                                                                                monkeypatch):
    import ui.resources

    made = []
    real = ui.resources.make_proposer
    monkeypatch.setattr(ui.resources, "make_proposer", lambda *a, **kw: made.append((a[0], kw)) or real(*a, **kw))
    at = open_app(tiny_target, tiny_draft, page="demo_chat")
    picker = at.multiselect(key="chat_proposers")
    assert "Draft + n-gram" in picker.options and picker.value == ["draft", "ngram"]  # asked for, not opened on
    assert not at.number_input(key="chat_p_min").disabled  # an EAGLE-3 draft takes the cut
    assert at.number_input(key="chat_p_min").help.startswith("stop a draft chain before a token")
    assert not [w for w in at.number_input if w.key == "chat_ngram_min_match"]  # only with draft + n-gram
    picker.set_value(["draft_ngram"]).run()
    at.number_input(key="chat_p_min").set_value(0.3).run()
    at.number_input(key="chat_ngram_min_match").set_value(2).run()
    at.number_input(key="chat_max_new_tokens").set_value(24).run()
    at.chat_input(key="chat_prompt").set_value("Repeat: a b c d, a b c d, a b c d").run()
    ok(at)
    assert not at.error, texts(at.error)
    assert made == [("draft_ngram", {"draft": tiny_draft, "draft_model": made[0][1]["draft_model"],
                                     "ngram_min_match": 2, "p_min": 0.3})]
    turn = at.session_state["chat_history"][0]
    side = turn["sides"]["draft_ngram"]
    assert side["identical"] and side["title"] == "Draft + n-gram, k=3, min match 2, p-min 0.30"
    by = side["metrics"]["proposed_by"]
    assert set(by) <= {"ngram", "draft"} and sum(by.values()) == len(side["step_lengths"]) > 0
    assert {r["proposed by"] for r in side["steps"][1:]} <= {"n-gram", "draft"}  # step 0 is the prefill
    assert f"n-gram proposed {by.get('ngram', 0)} of {sum(by.values())} steps" in texts(at.caption)
    baseline, walked = (_parses(shlex.split(line)[3:]) for line in turn["cli"].splitlines())  # the CLI takes them
    assert (walked.method, walked.draft, walked.p_min, walked.ngram_min_match) == ("draft_ngram", tiny_draft, 0.3, 2)
    assert baseline.method == "baseline" and baseline.p_min is None


def test_demo_chat_commands_carry_no_p_min_or_min_match_when_off():
    from ui.chat import generate_commands, side_settings

    paths = {"draft": "d", "draft_ngram": "d"}
    off = side_settings(["draft", "ngram"], paths, p_min=None, min_match=3)
    cli = generate_commands("hi", {"target": "t", "k": 3}, off)
    assert "--p-min" not in cli and "--ngram-min-match" not in cli and "draft_ngram" not in cli
    on = generate_commands("hi", {"target": "t", "k": 3}, side_settings(["draft_ngram"], paths, p_min=None,
                                                                         min_match=4))
    assert "--method draft_ngram --draft d" in on and "--ngram-min-match 4" in on and "--p-min" not in on


def test_demo_chat_p_min_on_a_dflash_draft_is_off_with_the_reason_not_a_traceback(runs, tiny_target, tiny_dflash):
    from engine.errors import WorkbenchError
    from ui import resources
    from ui.chat import side_settings

    at = open_app(tiny_target, tiny_dflash, page="demo_chat")
    at.session_state["chat_p_min"] = 0.3  # left from an EAGLE-3 draft
    at.run()
    ok(at)
    assert at.number_input(key="chat_p_min").disabled
    assert "p-min is off: it stops EAGLE-3 and P-EAGLE draft chains, and this draft is DFlash." in texts(at.caption)
    assert not at.error and not at.exception
    assert "p_min" not in side_settings(["draft"], {"draft": tiny_dflash}, p_min=0.3, min_match=3)["draft"]
    with pytest.raises(WorkbenchError, match="p-min 0.3 cannot apply: .*this draft is DFlash") as refused:
        resources.proposer("draft", tiny_target, tiny_dflash, p_min=0.3)  # refused before anything is loaded
    assert "set p-min to 0" in refused.value.hint


# -- benchmarks ---------------------------------------------------------------------------------------------


def test_benchmarks_page_launches_draft_ngram_in_process_with_p_min_and_min_match(runs, tiny_target, tiny_draft):
    from engine.measure.options import BACKEND_METHODS

    at = open_app(tiny_target, tiny_draft, page="benchmarks")
    assert at.selectbox(key="bench_backend").value == "transformers"
    assert at.multiselect(key="bench_methods").options == list(BACKEND_METHODS["transformers"])
    assert "transformers: in process (methods: " in at.selectbox(key="bench_backend").help
    assert "llama.cpp only" not in at.selectbox(key="bench_backend").help
    at.multiselect(key="bench_methods").set_value(["baseline", "draft_ngram"])
    at.number_input(key="bench_p_min").set_value(0.25)
    at.number_input(key="bench_ngram_min_match").set_value(4)
    at.number_input(key="bench_num_prompts").set_value(1)
    at.number_input(key="bench_max_new_tokens").set_value(4)
    at.button(key="FormSubmitter:bench_form-Launch benchmark").click().run()
    ok(at)
    argv = only_job(runs, "bench").argv
    assert argv[argv.index("--methods") + 1] == "baseline,draft_ngram"
    assert argv[argv.index("--draft") + 1] == tiny_draft  # draft_ngram runs the draft
    assert argv[argv.index("--p-min") + 1] == "0.25" and argv[argv.index("--ngram-min-match") + 1] == "4"
    # vLLM runs no draft_ngram and takes no p-min: the methods follow the backend, the inputs say why they are off
    at.selectbox(key="bench_backend").set_value("vllm").run()
    ok(at)
    assert at.multiselect(key="bench_methods").options == list(BACKEND_METHODS["vllm"])
    assert at.multiselect(key="bench_methods").value == ["baseline"]
    assert at.number_input(key="bench_p_min").disabled and at.number_input(key="bench_ngram_min_match").disabled
    assert "p-min is off: the vLLM backend takes none here" in texts(at.caption)
    shown = next(c.value for c in at.code if "--backend vllm" in c.value)  # the form's command, not the job's
    assert "--methods baseline --backend vllm" in shown and "--p-min" not in shown and "--draft" not in shown


def test_bench_commands_carry_p_min_and_min_match_only_where_they_apply(tiny_dflash):
    from ui import bench

    base = {"target": "t", "draft": "d", "k": 3, "backend": "transformers"}
    on = bench.bench_argv({**base, "methods": ["baseline", "draft", "draft_ngram"], "p_min": 0.4,
                           "ngram_min_match": 2}, "r.json")
    assert on[on.index("--p-min") + 1] == "0.4" and on[on.index("--ngram-min-match") + 1] == "2"
    off = bench.bench_argv({**base, "methods": ["baseline", "draft"], "p_min": 0.0, "ngram_min_match": 2}, "r.json")
    assert "--p-min" not in off and "--ngram-min-match" not in off and "--draft" in off
    no_draft = bench.bench_argv({**base, "methods": ["baseline", "ngram"], "p_min": 0.4}, "r.json")
    assert not {"--p-min", "--draft"} & set(no_draft)
    llama = bench.bench_argv({**base, "backend": "llama.cpp", "methods": ["baseline", "draft_ngram"], "p_min": 0.4,
                              "ngram_min_match": 2}, "r.json")
    assert "--p-min" in llama and "--ngram-min-match" not in llama  # llama.cpp's draft_ngram is its ngram-mod
    for argv in (on, off, no_draft, llama):
        _parses(argv)
    assert bench.p_min_problem("transformers", tiny_dflash).endswith("this draft is DFlash")
    assert bench.p_min_problem("llama.cpp", tiny_dflash) is None  # llama-server's --spec-draft-p-min
    assert bench.methods_for("transformers", False) == ["baseline", "ngram", "hf_prompt_lookup", "hf_assisted"]


# -- models page: the offline evaluator ---------------------------------------------------------------------


def test_models_page_evaluates_draft_ngram_with_a_p_min(runs, tiny_target, tiny_draft):
    at = open_app(tiny_target, tiny_draft, page="models")
    assert "--method" not in texts(at.code) and "--p-min" not in texts(at.code)  # the plain draft by default
    at.selectbox(key="models_eval_method").set_value("draft_ngram").run()
    at.number_input(key="models_eval_p_min").set_value(0.35).run()
    at.number_input(key="models_eval_ngram_min_match").set_value(5).run()
    ok(at)
    code = next(c.value for c in at.code if "python -m engine evaluate" in c.value)
    assert "--method draft_ngram" in code and "--p-min 0.35" in code and "--ngram-min-match 5" in code


def test_evaluate_commands_and_results_name_the_proposer_walked(runs, tiny_target, tiny_dflash):
    from ui import evaluate as evaluate_ui

    plain = evaluate_ui.evaluate_argv("d", "t", num_prompts=4, max_new_tokens=8, out="o.json")
    assert not {"--method", "--p-min", "--ngram-min-match"} & set(plain)
    mixed = evaluate_ui.evaluate_argv("d", "t", num_prompts=4, max_new_tokens=8, out="o.json", method="draft_ngram",
                                      p_min=0.3, ngram_min_match=4)
    args = _parses(mixed)
    assert (args.method, args.p_min, args.ngram_min_match) == ("draft_ngram", 0.3, 4)
    result = {"num_samples": 4, "max_new_tokens": 8, "by_k": {"1": {}, "2": {}}}
    assert " · proposer: draft · acceptance: in-process walk" in evaluate_ui.protocol(result)  # older: plain draft
    walked = {**result, "proposer": {"method": "draft_ngram", "p_min": 0.3, "ngram_min_match": 4}}
    assert " · proposer: draft + n-gram (min match 4), p-min 0.30 · " in evaluate_ui.protocol(walked)
    at = open_app(tiny_target, tiny_dflash, page="models")
    ok(at)
    assert at.number_input(key="models_eval_p_min").disabled
    assert "p-min is off: it stops EAGLE-3 and P-EAGLE draft chains, and this draft is DFlash." in texts(at.caption)
