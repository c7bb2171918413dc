"""Benchmarks: run `python -m engine bench` as a job and plot its JSON (acceptance per position, tau, speedup)."""

import json

import streamlit as st

from ui import bench, charts, recipes, state
from ui import evaluate as evaluate_ui
from ui import proposers as proposers_ui
from ui.cli import show_cli
from ui.errors import guard
from ui.jobs import launch, watch_jobs

st.title("Benchmarks")
st.caption("The baseline and each speculative method generate the same held-out prompts; acceptance uses vLLM's "
           "definitions, and the speedup ceiling is what the tokens of every step would give if drafting were free.")

ss = st.session_state
RECIPE_COLUMNS = {"training tokens": st.column_config.NumberColumn(format="localized"),
                  "mean acceptance length": st.column_config.NumberColumn(format="%.2f"),
                  "speedup": st.column_config.NumberColumn(format="%.2f×")}
target, draft = state.active_target(), state.active_draft()


def _evaluation(ev: evaluate_ui.Evaluation) -> None:
    """One offline evaluation: which draft, on what, from where, the advice, and its table per k."""
    advice = evaluate_ui.recommendation(ev.result, ev.here, bench.draft_speed(ev.result.get("draft")),
                                        shipped=ev.shipped)
    st.markdown(f"`{bench.short_name(ev.result.get('draft'))}` · {evaluate_ui.protocol(ev.result)} · {ev.where}"
                + (f" · {advice}" if advice else ""))
    st.dataframe(evaluate_ui.table_rows(ev.result), hide_index=True, width="stretch",
                 column_config=evaluate_ui.columns())
    if (fig := charts.acceptance_by_position(ev.result)) is not None:
        charts.show(fig, key=f"bench_eval_positions_{ev.where}")


results_tab, run_tab = st.tabs(["Results", "Run a benchmark"])  # opens on the results

with run_tab:
    # outside the form: the methods offered follow the backend at once
    backend = st.selectbox("Backend", bench.BACKENDS, key="bench_backend", help=bench.backend_help())
    available = bench.methods_for(backend, bool(draft))
    opening = [m for m in ("baseline", "draft", "ngram") if m in available]
    if "bench_methods" not in ss or any(m not in available for m in ss["bench_methods"]):
        ss["bench_methods"] = [m for m in ss.get("bench_methods", opening) if m in available] or opening
    cut_off, match_off = bench.p_min_problem(backend, draft), bench.min_match_problem(backend)
    with st.form("bench_form", border=False):
        c1, c2, c3 = st.columns(3)
        prompts = c1.text_input("Prompts", "sharegpt", key="bench_prompts",
                                help="A built-in dataset name (its held-out val prompts) or a JSONL file of "
                                '{"prompt": ...} / {"messages": [...]} rows.')
        n = c2.number_input("Prompts to use", 1, 10_000, 10, key="bench_num_prompts")
        new_tokens = c3.number_input("Max new tokens", 1, 4096, 64, key="bench_max_new_tokens")
        c4, c5 = st.columns(2)
        k = c4.number_input("k (drafts per step)", 1, 16, 3, key="bench_k")
        temp = c5.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="bench_temperature")
        methods = st.multiselect("Methods", available, key="bench_methods", help=bench.METHODS_HELP)
        if not draft:
            st.caption("No draft for this target: the `draft` and `draft_ngram` methods are not offered (n-gram and "
                       "transformers' own prompt lookup are).")
        c7, c8, c9 = st.columns([1, 1, 2])
        cut = c7.number_input("p-min (confidence cut)", 0.0, 1.0, 0.0, 0.05, format="%.2f", key="bench_p_min",
                              disabled=cut_off is not None, help=proposers_ui.P_MIN_HELP)
        min_match = c8.number_input("n-gram min match (draft_ngram)", *proposers_ui.MIN_MATCH_RANGE,
                                    proposers_ui.DEFAULT_MIN_MATCH, 1, key="bench_ngram_min_match",
                                    disabled=match_off is not None, help=proposers_ui.NGRAM_MIN_MATCH_HELP)
        off = ([f"p-min is off: {cut_off}."] if cut_off and draft else []) \
            + ([f"n-gram min match is off: {match_off}."] if match_off and draft else [])
        if off:
            c9.caption(" ".join(off))
        argv = bench.bench_argv({"target": target, "draft": draft, "prompts": prompts, "num_prompts": int(n),
                                 "max_new_tokens": int(new_tokens), "k": int(k), "temperature": float(temp),
                                 "methods": methods or ["baseline"], "backend": backend,
                                 "p_min": None if cut_off else proposers_ui.p_min_value(cut),
                                 "ngram_min_match": None if match_off else int(min_match)},
                                ss.get("bench_json_out") or bench.new_json_path())
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
        user = [key for key in files if not key.startswith(bench.SHIPPED_PREFIX)]
        seen = ss.setdefault("bench_seen", set(user))
        fresh = [key for key in user if key not in seen]
        if fresh:  # a run finished since the last look: show it
            ss["bench_result"] = fresh[0]
            seen.update(fresh)
        if ss.get("bench_result") not in files:  # opens on the active draft's measured speed, as every page quotes it
            ss["bench_result"] = bench.opening_result(files, state.active_draft())
        # the whole row: a long run label is read in full, in the field and in its list
        choice = st.selectbox("Result", list(files), key="bench_result", width="stretch",
                              format_func=lambda key: bench.label(key, files),
                              placeholder="no benchmark result yet",
                              help="Your runs, newest first, then the results that ship with the project "
                                   "(benchmarks/results/, each with the CPU and date it was measured on). It opens "
                                   "on the result the other pages quote for the active draft, else on the "
                                   "freshest result for this machine.")
        upload = st.file_uploader("…or a bench JSON", type=["json"], key="bench_upload", width=480)
        if upload is not None:
            result = bench.check(json.loads(upload.getvalue().decode("utf-8")))
        elif choice:
            result = bench.load(files[choice])
    if result is not None:
        with guard("Plotting"):
            where = bench.provenance(choice, files) if upload is None and choice else "an uploaded file"
            st.caption(bench.describe(result) + f" · measured on {where}")
            if upload is None and choice and not bench.of_this_kind(where):
                st.warning(f"These speeds are not known to be from this machine ({where}): speed depends on the CPU. "
                           "The *Run a benchmark* tab measures them here.", icon=":material/computer:")
            for flag in bench.load_flags(result):
                st.warning(flag + " Other processes kept the CPUs busy then: what was measured may not hold on a "
                           "quiet machine.", icon=":material/hourglass_top:")
            figs = charts.bench_figures(result)
            names = list(figs)
            for i in range(0, len(names), 2):
                cols = st.columns(2)
                for col, name in zip(cols, names[i:i + 2], strict=False):  # the last row may hold one
                    with col:
                        charts.show(figs[name], key=f"bench_fig_{name}", filename=f"bench-{name}")
            st.caption("Charts: hover for values; the camera button at the top right of a chart saves it as PNG.")
            st.dataframe(bench.table(result), hide_index=True, width="stretch")
            st.download_button("Download the table (CSV)", bench.to_csv(bench.table_raw(result)),
                               file_name="bench-methods.csv", mime="text/csv", key="bench_csv",
                               icon=":material/download:")
            if result.get("backend") == "vllm" and any(bench.drift(r) or r.get("identical_to_baseline") is False
                                                       for r in result["methods"].values()):
                st.info("**Why “identical to baseline: no” with vLLM.** vLLM runs the target in bfloat16 with "
                        "kernels whose rounding depends on the batch shape: verifying k+1 tokens at once does not "
                        "round exactly like decoding one token at a time. Where two tokens are nearly tied, the "
                        "argmax can flip and the answers part from there on. This is numeric drift of bf16, not a "
                        "loss of exactness of speculative decoding: the in-process benchmark (transformers, float32) "
                        "is identical token for token.", icon=":material/info:")
            if result.get("cost_curve"):
                st.caption("Target cost of one forward over n new tokens, in units of one token: " +
                           ", ".join(f"n = {k_}: {v:.2f}×" for k_, v in result["cost_curve"].items()))
            per_prompt = bench.per_prompt_rows(result)
            if per_prompt:
                with st.expander(f"Per prompt ({evaluate_ui.counted(len(per_prompt), 'prompt')}): which prompts "
                                 "accept well or badly",
                                 icon=":material/table_rows:"):
                    st.dataframe(per_prompt, hide_index=True, width="stretch")
                    st.download_button("Download per-prompt rows (CSV)", bench.to_csv(per_prompt),
                                       file_name="bench-per-prompt.csv", mime="text/csv", key="bench_csv_prompts",
                                       icon=":material/download:")
                    spec = [m for m, r in result["methods"].items() if bench.heatmap_data(result, m)]
                    if spec:
                        method = st.selectbox("Heat map of", spec, key="bench_heat_method")
                        z, labels = bench.heatmap_data(result, method)
                        charts.show(charts.acceptance_heatmap(z, labels, method), key="bench_heatmap",
                                    filename=f"bench-heatmap-{method}")
            if result.get("command"):
                show_cli(result["command"], label="The command that produced it")

    st.markdown("#### Training recipe: acceptance over checkpoints and the k sweep")
    with guard("Reading the recipe's results"):
        found = recipes.all_results()
        if not found:
            st.caption("No recipe results yet: `python -m engine recipe NAME` measures every kept checkpoint "
                       "(curve.json) and each k (sweep.json) in its work folder.")
        else:
            pick = st.selectbox("Measurements of", list(found), key="bench_recipe",
                                help="The shipped draft's model card (its tables), then each recipe's work folder.")
            rec = found[pick]
            st.caption(f"From `{rec.where}`" + (" (the card's tables: 2 decimals, tokens in thousands)."
                                                 if rec.rounded else " (exact values)."))
            source = "shipped model card" if rec.rounded else "recipe"
            if rec.curve:
                c1, c2 = st.columns(2)
                charts.show(charts.acceptance_curve(rec.curve, source=source), key="bench_recipe_curve",
                            filename="acceptance-vs-training-tokens", container=c1)
                charts.show(charts.checkpoint_heatmap(rec.curve, source=source), key="bench_recipe_heatmap",
                            filename="acceptance-per-position-and-checkpoint", container=c2)
            if rec.sweep:
                figs = charts.k_sweep(rec.sweep, source=source)
                c1, c2 = st.columns(2)
                for col, (name, fig) in zip((c1, c2), figs.items(), strict=True):
                    charts.show(fig, key=f"bench_recipe_{name}", filename=name.replace("_", "-"), container=col)
            t1, t2 = st.columns(2)
            for col, (title, rows, name) in zip((t1, t2), (("Checkpoints", recipes.curve_rows(rec), "curve"),
                                                           ("k sweep", recipes.sweep_rows(rec), "sweep")), strict=True):
                if rows:
                    col.markdown(f"**{title}**")
                    col.dataframe(rows, hide_index=True, width="stretch", column_config=RECIPE_COLUMNS)
                    col.download_button(f"Download ({name}.csv)", bench.to_csv(rows), file_name=f"recipe-{name}.csv",
                                        mime="text/csv", key=f"bench_recipe_csv_{name}", icon=":material/download:")

    st.markdown("#### Offline evaluations (decoding walk, every k)")
    with guard("Reading evaluation results"):
        evaluations = evaluate_ui.all_results()  # yours, then the shipped records in benchmarks/results
        if not evaluations:
            st.caption("No offline evaluation yet: the Models page evaluates the active draft "
                       "(`python -m engine evaluate`): what greedy decoding will measure for k = 1…5 in seconds, "
                       "with the forecast speedup.")
        for ev in evaluations[:6]:
            _evaluation(ev)
        if len(evaluations) > 6:  # every record stays reachable; the freshest for this machine come first
            with st.expander(f"{len(evaluations) - 6} older or other machines' evaluations"):
                for ev in evaluations[6:]:
                    _evaluation(ev)
