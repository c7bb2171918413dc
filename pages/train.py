"""Train: a form generated from the typed training config, launch as a job, live charts, stop/resume, compare."""

from pathlib import Path

import streamlit as st

from ui import catalog, charts, forms, recipes, state, training
from ui.errors import callback, guard
from ui.jobs import all_jobs, job_panel, job_selector, launch
from ui.training import TrainConfig

st.title("Train")
st.caption("Train a draft for the active target. Each field's help is its description in "
           "`engine.train.config.TrainConfig` or in the chosen algorithm's arguments; the run is "
           "`python -m engine train ...` in the background (`torchrun ... -m engine train ...` with several "
           "processes).")

ss = st.session_state
P = "train_f_"
ALGO_KEY = P + "algo"
ss.setdefault("train_run_name", training.new_run_name())
ss.setdefault(ALGO_KEY, training.defaults()["algo"])
ss.setdefault("train_nproc", 1)
forms.init_values(P, TrainConfig, {**training.defaults(), "target": state.active_target(),
                                   "out": training.default_out(ss["train_run_name"])})


def _algo() -> str:
    algo = ss.get(ALGO_KEY)
    return algo if algo in training.algorithm_names() else training.algorithm_names()[0]


def _init_algo_args(algo: str, *, force: bool = False) -> None:
    forms.init_values(training.algo_prefix(P, algo), training.args_class(algo), training.algo_defaults(algo),
                      force=force)


def _form_config():
    """(TrainConfig or None, errors by field) from both parts of the form."""
    algo = _algo()
    args_cls = training.args_class(algo)
    algo_values = forms.current_values(training.algo_prefix(P, algo), args_cls)
    _, arg_errors = forms.validation_errors(args_cls, algo_values)
    values = training.config_values(forms.current_values(P, TrainConfig), algo, algo_values)
    cfg, errors = forms.validation_errors(TrainConfig, values)
    errors.pop("algo_args", None)
    if arg_errors:  # shown at their own fields, not again as a config-wide message
        errors[""] = [m for m in errors.get("", []) if not m.startswith(f"{algo} arguments:")]
        if not errors[""]:
            del errors[""]
    for name, messages in arg_errors.items():
        errors.setdefault(name, []).extend(messages)
    target_problem = (training.data_target_problem(cfg.data, cfg.target, cfg.accept_target_change)
                      if cfg is not None else None)
    if target_problem:  # training would refuse it: say so at the field, before launching
        errors.setdefault("target", []).append(target_problem)
    return (cfg if not errors else None), errors


def _preset(values: dict) -> None:
    forms.init_values(P, TrainConfig, values, force=True)


def _reset() -> None:
    ss["train_run_name"] = training.new_run_name()
    _preset({**training.defaults(), "target": state.active_target(),
             "out": training.default_out(ss["train_run_name"])})
    _init_algo_args(_algo(), force=True)


def _launch() -> None:
    # read the form here, not at render time: an edit committed by this very click is included
    cfg, errors = _form_config()
    if cfg is None:
        raise ValueError("; ".join(f"{k or 'config'}: {', '.join(v)}" for k, v in errors.items()))
    argv, yaml_fields = training.train_argv(cfg)
    out = cfg.out
    if yaml_fields:
        argv = argv + ["--config", training.write_yaml_overrides(out, yaml_fields)]
    job = launch(argv, kind="train", name=Path(out).name, launcher=training.launcher(int(ss["train_nproc"])))
    if job is not None:
        ss["train_job"] = job.id
        ss["train_tab"] = TABS[1]  # follow the launched run: open its live view
        ss["train_run_name"] = training.new_run_name()
        ss[P + "out"] = training.default_out(ss["train_run_name"])  # the next run gets its own folder


TABS = ["New run", "Watch and control runs", "Compare runs"]
tab_new, tab_watch, tab_compare = st.tabs(TABS, key="train_tab", on_change="rerun")

# -- new run ----------------------------------------------------------------------------------------
with tab_new:
    b1, b2, b3 = st.columns(3)
    b1.button("Smoke-test preset (12 steps, online)", key="train_smoke", icon=":material/bolt:",
              on_click=callback("Applying the preset", _preset, training.SMOKE), help=training.smoke_help(_algo()))
    b2.button("Use the active target", key="train_use_active", icon=":material/hub:",
              on_click=callback("Setting the target", _preset, {"target": state.active_target()}))
    b3.button("Reset to defaults", key="train_reset", icon=":material/restart_alt:",
              on_click=callback("Resetting", _reset))
    b1.caption(training.smoke_summary(_algo()))  # its duration in sight, not only in the tooltip

    algo_names = training.algorithm_names()
    st.selectbox("Algorithm", algo_names, key=ALGO_KEY, format_func=training.algorithm_title,
                 help=TrainConfig.model_fields["algo"].description)
    _init_algo_args(_algo())
    followed = training.data_target(ss.get(P + "data"))
    if followed and ss.get("train_data_followed") != ss.get(P + "data"):  # new data: its target follows it
        ss["train_data_followed"] = ss.get(P + "data")
        forms.init_values(P, TrainConfig, {"target": followed}, force=True)
    cfg, errors = _form_config()
    forms.model_form(P, TrainConfig, training.GROUPS, errors=errors, expanded=["What to train"],
                     exclude=training.COMMON_SKIP, human=True)
    forms.model_form(training.algo_prefix(P, _algo()), training.args_class(_algo()), training.algo_groups(_algo()),
                     errors=errors, human=True)
    st.number_input("Processes (torchrun --nproc-per-node)", min_value=1, max_value=64, step=1, key="train_nproc",
                    help="More than 1 launches `torchrun --standalone --nproc-per-node N -m engine train ...` on this "
                         "machine (one process per GPU; on a CPU, gloo). Pick the strategy in 'Several processes'. "
                         "Across machines, see the multi-node commands in docs/serving.md.")
    nproc = int(ss["train_nproc"])
    if cfg is not None and nproc == 1 and cfg.strategy == "fsdp":
        st.caption("fsdp shards over several processes; with 1 process the draft trains whole in that process.")
    untouched = not ss.get(P + "data") and not ss.get(P + "online_dataset")
    for message in errors.get("", []):
        if untouched and message.startswith("give `data`"):  # nothing chosen yet: a pointer, not a warning
            st.caption(":material/arrow_upward: Choose what to train on under *What to train*: a hidden-states folder "
                       "(extract one on the Data page) or a dataset to train online, or press the smoke-test preset.")
        else:
            st.warning(message, icon=":material/warning:")
    if cfg is not None:
        argv, yaml_fields = training.train_argv(cfg)
        out = Path(cfg.out)
        ckpt = training.latest_checkpoint(out)
        if ckpt:
            st.info(f"`{out}` already holds checkpoints (latest `{ckpt}`): the run resumes from there.",
                    icon=":material/history:")
        shown = argv + (["--config", str(out / "train_overrides.yaml")] if yaml_fields else [])
        st.markdown("**Command**")
        st.code(training.launch_command(shown, nproc), language="bash", wrap_lines=True)
        if yaml_fields:
            st.caption(f"`train_overrides.yaml` will hold {sorted(yaml_fields)} (not expressible as flags).")
    st.button("Launch training", key="train_launch", type="primary", icon=":material/rocket_launch:",
              disabled=cfg is None,
              on_click=callback("Launching training", _launch))
    if cfg is None:
        st.caption("Complete or fix the fields named above to launch.")

# -- watch ------------------------------------------------------------------------------------------
with tab_watch:
    jobs = all_jobs(["train"])
    if not jobs:
        st.info("No training runs yet: launch one in the first tab (they are listed from `runs/`, so they survive "
                "a browser refresh and an app restart).", icon=":material/info:")
    else:
        job = job_selector("Run", jobs, key="train_watch", prefer_key="train_job")
        out = training.train_out(job)
        left, right = st.columns([2, 3])
        with left:
            job_panel(job.id, key="train_panel", log_lines=15)
            ckpt = training.latest_checkpoint(out)
            if not job.running and ckpt and job.status.state != "done":
                st.button(f"Resume from {ckpt}", key="train_resume", icon=":material/play_arrow:",
                          on_click=callback("Resuming", lambda: ss.update(
                              train_job=getattr(launch(job.argv, kind="train", name=out.name, launcher=job.launcher),
                                                "id", job.id))),
                          help="Relaunch the same command: the trainer continues from the latest checkpoint.")
            st.caption(f"Output folder: `{out}`" + (f" · latest checkpoint `{ckpt}`" if ckpt else ""))
            if (out / "draft" / "config.json").is_file():
                if st.button("Use the trained draft", key="train_use_draft", icon=":material/check:"):
                    state.set_draft(str(out / "draft"))
                    st.toast("Active draft set (see the sidebar)")

        with right:
            @st.fragment(run_every=2.0 if job.running else None)
            def live_charts() -> None:
                with guard("Reading metrics"):
                    rows = training.read_metrics(out)
                    if not rows:
                        st.info("No metrics yet: the trainer writes `metrics.jsonl` after its first steps.")
                        return
                    last = training.last_row(rows) or {}
                    val = training.last_row(rows, "val") or {}
                    # two rows in the panel's narrow column: the acceptance metrics' labels fit uncut
                    m = st.columns(3) + st.columns(2)
                    m[0].metric("step", last.get("step", 0))
                    m[1].metric("loss", f"{last['loss']:.3f}" if "loss" in last else "–")
                    m[2].metric("tokens/s", f"{last['tokens_per_s']:.0f}" if "tokens_per_s" in last else "–")
                    m[3].metric("est. acceptance length", f"{last['est_acceptance_length']:.2f}"
                                if "est_acceptance_length" in last else "–",
                                delta=f"validation {val['est_acceptance_length']:.2f}"
                                if "est_acceptance_length" in val else None, delta_color="off", delta_arrow="off",
                                help="Per-token estimate on the training batches; the figure below it is the "
                                     "same estimate on the validation split (not a change).")
                    m[4].metric("decoding walk (val)", f"{val['walk_acceptance_length']:.2f}"
                                if "walk_acceptance_length" in val else "–",
                                help="Mean acceptance length greedy decoding will measure on the validation samples "
                                     "at the draft's k (the draft-verify walk of `python -m engine evaluate`); best k "
                                     + (f"{val['walk_best_k']:.0f}" if "walk_best_k" in val else "–") + ".")
                    ranks = training.rank_progress(out)
                    if ranks and (ranks[0].get("world", 1) > 1 or training.job_processes(job) > 1):
                        st.markdown(f"**Processes** ({ranks[0].get('world', len(ranks))} ranks, "
                                    f"`{out / 'progress'}`)")
                        st.dataframe(training.progress_table(ranks), hide_index=True)
                    figs = charts.training_figures({out.name: rows})
                    for name, fig in figs.items():
                        charts.show(fig, key=f"train_chart_{name}", filename=f"{out.name}-{name}")

            live_charts()

# -- compare ----------------------------------------------------------------------------------------
with tab_compare:
    @st.fragment(run_every=5.0 if any(j.running for j in all_jobs(["train"])) else None)
    def compare_runs() -> None:
        """Re-read runs/ every few seconds while a run is going, so runs started after the page loaded appear."""
        with guard("Finding runs"):
            runs = training.metric_runs()
            if not runs:
                st.info("No run has written metrics yet.")
            default = list(runs)[:2]
            if ss.get("train_compare") in (None, ss.get("train_compare_auto")):  # untouched: follow new runs
                ss["train_compare"] = default
            ss["train_compare_auto"] = default
            chosen = st.multiselect("Runs to compare", list(runs), key="train_compare")
            shipped = recipes.shipped_curve(catalog.shipped_draft(state.active_target()))
            show_shipped = shipped is not None and st.checkbox(
                "Beside them, the shipped draft's own curve", True, key="train_compare_shipped",
                help=f"Mean acceptance length decoding measured on held-out prompts at each kept checkpoint of the "
                     f"shipped draft (its model card, `{shipped.where if shipped else ''}`), by optimizer step (runs "
                     "with other batch sizes see other numbers of tokens per step).")
            if chosen or show_shipped:
                figs = charts.training_figures({name: training.read_metrics(runs[name]) for name in chosen},
                                               reference=shipped.curve if show_shipped else None)
                figs = {name: fig for name, fig in figs.items() if fig.data}  # the shipped curve alone: one chart
                # one chart per row, the page's full width: a third of it, less the legend of several runs, left
                # the plot about 100 px wide with its labels overlapping
                for name, fig in figs.items():  # empty charts were dropped
                    charts.show(fig, key=f"train_compare_{name}", filename=f"compare-{name}")

    compare_runs()
    st.button("Refresh the list of runs", key="train_compare_refresh", icon=":material/refresh:")

with st.expander("Equivalent CLI commands", icon=":material/terminal:"):
    st.code("python -m engine train --help\npython -m engine jobs            # list runs\n"
            "python -m engine jobs stop JOB   # SIGTERM: the trainer checkpoints and exits\n"
            "python -m engine train ... (same flags, same --out)   # resumes from the latest checkpoint\n"
            "torchrun --standalone --nproc-per-node 2 -m engine train ... --strategy fsdp   # 2 processes",
            language="bash")

