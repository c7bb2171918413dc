"""Benchmarks: run `python -m engine bench` as a job and plot its JSON (acceptance per position, tau, speedup)."""

import json

import streamlit as st

from ui import bench, charts, state
from ui import evaluate as evaluate_ui
from ui.cli import show_cli
from ui.errors import guard
from ui.jobs import launch, watch_jobs

st.title("Benchmarks")
st.caption("The baseline and each speculative method generate the same held-out prompts; acceptance uses vLLM's "
           "definitions, and the speedup ceiling is what the acceptance would give if drafting were free.")

ss = st.session_state
target, draft = state.active_target(), state.active_draft()
run_tab, results_tab = st.tabs(["Run a benchmark", "Results"])

with run_tab:
    with st.form("bench_form", border=False):
        c1, c2, c3 = st.columns(3)
        prompts = c1.text_input("Prompts", "sharegpt", key="bench_prompts",
                                help="A built-in dataset name (its held-out val prompts) or a JSONL file of "
                                '{"prompt": ...} / {"messages": [...]} rows.')
        n = c2.number_input("Prompts to use", 1, 10_000, 10, key="bench_num_prompts")
        new_tokens = c3.number_input("Max new tokens", 1, 4096, 64, key="bench_max_new_tokens")
        c4, c5, c6 = st.columns(3)
        k = c4.number_input("k (drafts per step)", 1, 16, 3, key="bench_k")
        temp = c5.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="bench_temperature")
        backend = c6.selectbox("Backend", ["transformers", "vllm"], key="bench_backend",
                               help="transformers: in process; vllm: a real vLLM server (needs the vLLM environment).")
        available = [m for m in bench.METHODS if m != "draft" or draft]
        methods = st.multiselect("Methods", available, default=[m for m in ("baseline", "draft", "ngram")
                                                                if m in available], key="bench_methods")
        if not draft:
            st.caption("No draft for this target: the `draft` method is not offered (n-gram and transformers' own "
                       "prompt lookup are).")
        argv = bench.bench_argv(target=target, draft=draft, prompts=prompts, num_prompts=int(n),
                                max_new_tokens=int(new_tokens), k=int(k), temperature=float(temp),
                                methods=methods or ["baseline"], backend=backend,
                                json_out=ss.get("bench_json_out") or bench.new_json_path())
        if st.form_submit_button("Launch benchmark", type="primary", icon=":material/rocket_launch:"):
            if "baseline" not in methods:
                st.warning("Add `baseline`: speedups are measured against it.")
            else:
                argv[argv.index("--json") + 1] = bench.new_json_path()
                job = launch(argv, kind="bench")
                if job:
                    ss["bench_job"] = job.id
    show_cli(argv)
    watch_jobs(["bench"], "Benchmark jobs", key="bench")

with results_tab:
    result = None
    with guard("Loading results"):
        files = bench.results()
        c1, c2 = st.columns([2, 1])
        if ss.get("bench_result") not in files:
            ss["bench_result"] = next(iter(files), None)
        choice = c1.selectbox("Result", list(files), key="bench_result", placeholder="no finished benchmark yet")
        upload = c2.file_uploader("…or a bench JSON", type=["json"], key="bench_upload")
        if upload is not None:
            result = bench.check(json.loads(upload.getvalue().decode("utf-8")))
        elif choice:
            result = bench.load(files[choice])
    if result is not None:
        with guard("Plotting"):
            st.caption(f"target `{result.get('target')}` · draft `{result.get('draft')}` · k={result.get('k')} · "
                       f"{result.get('num_prompts')} prompts × {result.get('max_new_tokens')} tokens · "
                       f"temperature {result.get('temperature')} · {result.get('backend')} on {result.get('device')}")
            figs = charts.bench_figures(result)
            cols = st.columns(3)
            for col, (name, fig) in zip(cols, figs.items()):
                with col:
                    st.plotly_chart(fig, key=f"bench_fig_{name}")
            st.dataframe(bench.table(result), hide_index=True, width="stretch")
            if result.get("cost_curve"):
                st.caption("Target cost of one forward over n tokens relative to one token: " +
                           ", ".join(f"{k_}: {v:.2f}×" for k_, v in result["cost_curve"].items()))
            if result.get("command"):
                show_cli(result["command"], label="The command that produced it")

    st.markdown("#### Offline evaluations (decoding walk, every k)")
    with guard("Reading evaluation results"):
        evaluations = evaluate_ui.results()
        if not evaluations:
            st.caption("None yet: the Models page evaluates the active draft (`python -m engine evaluate`): what "
                       "greedy decoding will measure for k = 1…5 in seconds, with the forecast speedup.")
        for job, evaluation in evaluations[:5]:
            fc = evaluation.get("forecast") or {}
            st.markdown(f"`{evaluation.get('draft')}` · {evaluation.get('num_samples')} held-out samples × "
                        f"{evaluation.get('max_new_tokens')} tokens"
                        + (f" · recommended k {fc['recommended_k']}" if fc else ""))
            st.dataframe(evaluate_ui.table_rows(evaluation), hide_index=True, width="stretch")
