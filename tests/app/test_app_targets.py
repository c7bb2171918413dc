"""The app follows the target the work was made for: the Train page takes the data's target and flags another one,
choosing a draft makes its verifier the active target, Demo chat refuses a draft of another shape; the Models page
says what a new target is and what an extraction and a training run for it need here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.data.options import ExtractOptions
from testkit.app import ROOT, ok, open_app, texts
from tiny import save_tiny_target


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setenv("WORKBENCH_RUNS", str(root))
    return root


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from engine.algos import ALGOS, default_algo
    from engine.data.extract.dataset import extract_dataset
    from engine.targets.loading import load_target

    root = tmp_path_factory.mktemp("app-follow")
    a = save_tiny_target(root / "a", "llama")
    narrow = save_tiny_target(root / "narrow", "llama", hidden_size=32)
    gemma = save_tiny_target(root / "gemma", "gemma2")
    data = root / "hs"
    extract_dataset(ExtractOptions(target=str(a), dataset="sharegpt", out=data, max_samples=4, max_length=48,
                                   dtype="fp32", device="cpu"))
    algorithm = ALGOS.get(default_algo())
    target = load_target(str(a))
    draft = algorithm.build(target, algorithm.args_class(num_layers=1), aux_layer_ids=[1, 2, 3],
                            token_counts=torch.arange(target.vocab_size).flip(0), seed=0)
    draft_dir = root / "draft"
    algorithm.save(draft, draft_dir)
    return {"a": str(a), "narrow": str(narrow), "gemma": str(gemma), "data": str(data), "draft": str(draft_dir)}


def test_train_page_follows_the_datas_target_and_flags_another(runs, made):
    at = open_app("smollm2-135m-instruct", page="train")
    at.text_input(key="train_f_data").set_value(made["data"]).run()
    ok(at)
    assert Path(at.text_input(key="train_f_target").value).resolve() == Path(made["a"]).resolve()
    assert not at.button(key="train_launch").disabled
    at.text_input(key="train_f_target").set_value(made["narrow"]).run()
    ok(at)
    shown = texts(at.error) + texts(at.warning) + texts(at.markdown) + texts(at.caption)
    assert f"--target {made['narrow']} is not the target the data was made for" in shown
    assert "width 64 vs 32" in shown
    assert at.button(key="train_launch").disabled


def test_choosing_a_draft_makes_its_verifier_the_active_target(runs, made):
    at = open_app("smollm2-135m-instruct", page="models")
    at.radio(key="models_draft_source").set_value("Local folder").run()
    at.text_input(key="models_draft_folder").set_value(made["draft"]).run()
    ok(at)
    assert "using it makes that the active target" in texts(at.caption)
    at.button(key="models_use_draft").click().run()
    ok(at)
    assert Path(at.session_state["app_target"]).resolve() == Path(made["a"]).resolve()
    assert at.session_state["app_draft"] == made["draft"]


def test_choices_survive_a_restart_and_the_reset_forgets_them(runs, made, app_settings):
    def session(**chosen) -> AppTest:  # a new browser session (a reload, or the app restarted) of app.py
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
        for key, value in chosen.items():
            at.session_state[key] = value  # what its pages would have set
        at.run()
        ok(at)
        return at

    session(app_target=made["a"], app_draft=made["draft"], chat_k=5)
    assert app_settings.is_file()  # written when the choices changed, atomically (engine.fsutil)
    again = session()
    assert again.session_state["app_target"] == made["a"] and again.session_state["app_draft"] == made["draft"]
    assert again.session_state["chat_k"] == 5
    assert "/".join(Path(made["a"]).parts[-2:]) in texts(again.sidebar.markdown)  # the sidebar names it
    again.button(key="app_reset").click().run()  # the sidebar's reset: the defaults here and in the next session
    ok(again)
    assert again.session_state["app_target"] == "smollm2-135m-instruct" and again.session_state["chat_k"] == 3
    assert not app_settings.exists()
    assert session().session_state["app_target"] == "smollm2-135m-instruct"
    app_settings.write_text('{"app_target": "/no/such/folder", "chat_k": 99, "chat_seed": 7}')  # stale or bad values
    fourth = session()  # each falls back to its default, not to an error; the good ones stay
    assert fourth.session_state["app_target"] == "smollm2-135m-instruct"
    assert fourth.session_state["chat_k"] == 3 and fourth.session_state["chat_seed"] == 7


def test_models_page_says_not_tried_for_a_family_nothing_here_covers(runs, tmp_path):
    """A local OLMo-3 folder (config only): no test runs the family and vLLM's text-model registry does not list its
    class, so the Models page asserts nothing about vLLM; the registry's own answer is given where it has one, and a
    linear-attention target (Qwen3-Next) is said not to be served beside a draft on a CPU."""
    import json

    from transformers import Olmo3Config, Qwen3NextConfig

    from engine.data.plan import plan_target
    from engine.format import vllm_rules as vr
    from ui.plan import vllm_fact

    folder = tmp_path / "olmo-3"
    folder.mkdir()
    config = Olmo3Config(num_hidden_layers=2).to_dict() | {"architectures": ["Olmo3ForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    at = open_app(str(folder), page="models")
    facts = {row["fact"]: row["value"] for d in at.table if "fact" in d.value.columns
             for row in d.value.to_dict("records")}
    assert facts["tested end to end"].startswith("no")
    assert facts["vLLM serves drafts beside it"].startswith("not tried: Olmo3ForCausalLM is not in "
                                                          f"the model registry of {vr.CPU_BUILD_LABEL}")
    (folder / "config.json").write_text(json.dumps(config | {"architectures": ["ApertusForCausalLM"]}))
    assert vllm_fact(plan_target(str(folder))).startswith(f"yes by vLLM's registry ({vr.CPU_BUILD_LABEL}): its "
                                                          "ApertusForCausalLM class")  # a class the registry lists
    (folder / "config.json").write_text(json.dumps(Qwen3NextConfig(num_hidden_layers=4).to_dict()
                                                   | {"architectures": ["Qwen3NextForCausalLM"]}))
    assert vllm_fact(plan_target(str(folder))).startswith(f"not on a CPU: vLLM's CPU build ({vr.CPU_BUILD_LABEL}) "
                                                          "does not decode speculatively beside linear-attention")


def test_demo_chat_refuses_a_draft_of_another_shape(runs, made):
    at = open_app(made["narrow"], made["draft"], page="demo_chat")
    assert f"--target {made['narrow']} is not the target the draft was made for" in texts(at.error)
    assert at.multiselect(key="chat_proposers").options == ["n-gram (prompt lookup)"]


def test_models_page_says_the_family_and_what_runs_need(runs, made):
    from engine.algos import ALGOS

    at = open_app(made["gemma"], page="models")
    facts = {row["fact"]: row["value"] for d in at.table if "fact" in d.value.columns
             for row in d.value.to_dict("records")}
    assert facts["family"] == "Gemma 2" and "sqrt(H)" in facts["what a draft sees"]
    assert facts["tested end to end"].startswith("yes")
    assert facts["vLLM serves drafts beside it"].startswith("no: vLLM's Gemma2ForCausalLM class")
    table = next(d.value for d in at.dataframe if "layer ids (extract)" in d.value.columns)
    assert len(table) == len(ALGOS.names())
    assert all(row.endswith("fits") for row in table["extraction disk"])
    assert "Extraction memory" in texts(at.caption)
    # a run far larger than this machine's disk is flagged before anything starts
    at.number_input(key="models_plan_samples").set_value(10_000_000).run()
    at.number_input(key="models_plan_tokens").set_value(131_072).run()
    ok(at)
    table = next(d.value for d in at.dataframe if "layer ids (extract)" in d.value.columns)
    assert all("does NOT fit" in row for row in table["extraction disk"])


def test_a_settings_file_of_the_users_is_never_replaced_or_removed(app_settings):
    """$WORKBENCH_SETTINGS naming a file that holds other data: saving and the reset leave it byte for byte."""
    import streamlit as st

    from ui import state

    app_settings.write_text('{"my": "own notes"}\n')
    before = app_settings.read_bytes()
    st.session_state.clear()
    st.session_state[state.SAVED] = dict(state.DEFAULTS)
    st.session_state[state.TARGET] = "somewhere/else"
    state.save_state()
    state.reset_settings()
    assert app_settings.read_bytes() == before
    assert not state.settings_file_is_ours(app_settings)
    app_settings.unlink()
    assert state.settings_file_is_ours(app_settings)  # absent: ours to write
