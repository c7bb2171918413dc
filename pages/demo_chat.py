"""Demo chat: one prompt answered by the baseline and each chosen proposer side by side, and why each is fast or
slow."""

import time

import streamlit as st

from ui import bench, catalog, charts, resources, state
from ui import chat as chat_ui
from ui import proposers as proposers_ui
from ui.chat import (
    BLOCK_LEGEND,
    SHORT_TOKENS,
    explain,
    explain_table,
    generate_commands,
    identical_badge,
    kernel_exact,
    kernel_load_note,
    kernel_rows,
    kernel_rule,
    kernel_source,
    kernel_untried,
    race_progress,
)
from ui.cli import show_cli
from ui.errors import guard
from ui.tokens import legend_html, plain_html, spec_html, waiting_html

st.title("Demo chat")
st.caption("The target answers the same prompt alone (baseline) and with each proposer you pick drafting tokens it "
           "verifies, side by side. With temperature 0 every answer must be identical; speculative decoding only "
           "changes the speed. Each turn says why a proposer was faster or slower than the baseline.")

ss = st.session_state
ss.setdefault("chat_history", [])
target_name = state.active_target()
draft = state.active_draft()
if (draft_problem := state.draft_target_problem(draft)) is not None:
    st.error(f"**The active draft cannot run with this target:** {draft_problem}", icon=":material/link_off:")
    draft = None  # n-gram only, until a draft of this target is chosen on the Models page
EXAMPLES = ["Repeat this sentence three times: The cat sat on the mat.",
            "Write a Python function that adds two numbers.",
            "What is speculative decoding? Answer in two sentences."]
PROPOSERS = {"draft": "Draft model", "draft_2": "Second draft", "draft_ngram": "Draft + n-gram",
             "ngram": "n-gram (prompt lookup)"}
NO_SECOND = "none"

# -- controls -------------------------------------------------------------------------------------
with st.container(border=True):
    c1, c2, c3, c4, c5 = st.columns([2, 1, 1, 1, 1])
    others = [d for d in catalog.find_drafts() if d.path != draft] if draft else []
    second_options = {NO_SECOND: "none"} | {d.path: d.label for d in others}
    if ss.get("chat_second_draft") not in second_options:
        ss["chat_second_draft"] = NO_SECOND
    second = ss["chat_second_draft"] if ss["chat_second_draft"] != NO_SECOND else None
    options = (["draft"] if draft else []) + (["draft_2"] if second else []) + (["draft_ngram"] if draft else []) \
        + ["ngram"]
    opening = [p for p in options if p != "draft_ngram"]  # draft + n-gram when asked for
    if "chat_proposers" not in ss or any(p not in options for p in ss["chat_proposers"]):
        ss["chat_proposers"] = [p for p in ss.get("chat_proposers", opening) if p in options] or opening
    with c1:
        chosen = st.multiselect("Proposers (each answers beside the baseline)", options, key="chat_proposers",
                                format_func=PROPOSERS.get,
                                help="Draft: the active draft model. n-gram: copies continuations of earlier text "
                                "(no model; works on repetitive prompts). Draft + n-gram: per step, the n-gram's "
                                "proposal where its match is long enough, else the draft's. Every proposer answers "
                                "the same prompt.")
        if not draft:
            st.caption("No draft for this target: n-gram only. Pick or train a draft on the Models page.")
        elif {"draft", "draft_ngram"} & set(chosen):
            st.caption(f"Draft: `{state.short(draft, 60)}`")
    with c2:
        k = st.slider("k (drafts per step)", 1, 8, key="chat_k")  # values: ui.state.Settings
    with c3:
        temperature = st.slider("Temperature", 0.0, 1.5, step=0.1, key="chat_temperature",
                                help="0 = greedy: all answers identical. Above 0 speculative sampling is lossless "
                                "in distribution: the same distribution as the target alone, not the same text.")
    with c4:
        max_new = st.number_input("Max new tokens", 8, 1024, step=8, key="chat_max_new_tokens")
    with c5:
        seed = st.number_input("Seed", 0, 2**31 - 1, key="chat_seed")
    c6, c8, c7 = st.columns([2, 2, 1])
    with c6:
        multi_turn = st.toggle("Continue the conversation (earlier turns are context)", key="chat_multi_turn",
                               value=False)
    with c8:
        if others:
            st.selectbox("Second draft to compare (optional)", list(second_options), key="chat_second_draft",
                         format_func=second_options.get)
    with c7:
        if st.button("Clear chat", key="chat_clear", icon=":material/delete_sweep:", disabled=not ss["chat_history"]):
            ss["chat_history"] = []
            st.rerun()
    paths = {"draft": draft, "draft_2": second, "draft_ngram": draft}
    p_min, min_match = None, proposers_ui.DEFAULT_MIN_MATCH
    if draft:  # the draft's own settings: its confidence cut, and draft + n-gram's rule
        c9, c10, c11 = st.columns([1, 1, 3])
        cut_applies, cut_note = chat_ui.p_min_state(chosen, paths, PROPOSERS)
        with c9:
            cut = st.number_input("p-min (confidence cut)", 0.0, 1.0, step=0.05, format="%.2f", key="chat_p_min",
                                  disabled=not cut_applies, help=proposers_ui.P_MIN_HELP)
            p_min = proposers_ui.p_min_value(cut) if cut_applies else None
        with c10:
            if "draft_ngram" in chosen:
                min_match = int(st.number_input("n-gram min match", *proposers_ui.MIN_MATCH_RANGE, step=1,
                                                key="chat_ngram_min_match", help=proposers_ui.NGRAM_MIN_MATCH_HELP))
        with c11:
            if cut_note:
                st.caption(cut_note)
    settings = chat_ui.side_settings(chosen, paths, p_min=p_min, min_match=min_match)
    if temperature > 0:
        st.info("Temperature > 0: lossless means every speculative answer is drawn from **the same distribution** "
                "as the target alone, not that it is the same text. Each side draws its own samples, so the texts "
                "differ. The sampling check (`python -m pytest tests/engine/test_generate.py -k "
                "sampled_speculation`) compares the two distributions with a chi-square test.",
                icon=":material/casino:")

st.html(legend_html())
st.caption("Examples:")
ex_cols = st.columns(len(EXAMPLES))
for i, (col, text) in enumerate(zip(ex_cols, EXAMPLES, strict=True)):
    if col.button(text, key=f"chat_example_{i}", width="stretch"):
        ss["chat_pending"] = text


def _messages(prompt: str) -> list[dict]:
    msgs = []
    if multi_turn:
        for turn in ss["chat_history"]:
            msgs += [{"role": "user", "content": turn["prompt"]}, {"role": "assistant", "content": turn["baseline"]}]
    return msgs + [{"role": "user", "content": prompt}]


def _speedup_text(row: dict) -> str | None:
    if row.get("speedup") is None:
        return None
    if row["short"]:
        return f"speedup ≈{row['speedup']:.1f}× (only {row['tokens']} tokens: a rough indication)"
    return f"speedup **{row['speedup']:.2f}×**"


def _metrics_line(side: dict, row: dict | None) -> str:
    parts = [f"{side['tokens']} tokens"]
    if side.get("decode_tokens_per_s"):
        parts.append(f"{side['decode_tokens_per_s']:.1f} tokens/s")
    if side.get("first_token_s") is not None:
        parts.append(f"first token {side['first_token_s']:.2f} s")
    if side.get("mean_acceptance_length"):  # the names the explanation below uses, for the same quantities
        parts.append(f"mean acceptance length {side['mean_acceptance_length']:.2f} (on the steps it drafted)")
    if by := side.get("proposed_by"):  # draft + n-gram: who proposed its steps
        parts.append(f"n-gram proposed {by.get('ngram', 0)} of {sum(by.values())} steps")
    if row and row.get("tokens_per_step"):
        parts.append(f"{row['tokens_per_step']:.2f} tokens per step (all steps)")
    if row and _speedup_text(row):
        parts.append(_speedup_text(row))
    return " · ".join(parts)


def _why(turn: dict, index: int) -> None:
    rows = turn["explain"]
    if not rows:
        return
    with st.container(border=True):
        st.markdown("**Why this speed**")
        for row in rows.values():
            won = row.get("speedup") is not None and row["speedup"] >= 1.0
            st.markdown(f"{':material/trending_up:' if won else ':material/trending_down:'} {row['sentence']}")
        if any(r["short"] for r in rows.values()):
            st.caption(f"Answers under {SHORT_TOKENS} tokens: the speed of a few steps varies a lot; ask for a longer "
                       "answer (or run Benchmarks) before drawing conclusions.")
        if turn.get("busy"):
            st.caption(turn["busy"])
        st.table(explain_table(rows), hide_index=True)
        c1, c2 = st.columns(2)
        charts.show(charts.step_cost_bars(rows), key=f"chat_cost_{index}", filename="step-cost", container=c1)
        if any(r.get("per_position_acceptance") for r in rows.values()):
            charts.show(charts.per_position_compare(rows), key=f"chat_pos_{index}", filename="acceptance-per-position",
                        container=c2)
        speed = bench.draft_speed(turn.get("draft"))
        if speed and "draft" in rows:
            st.caption(bench.draft_speed_text(speed) + " This turn is one prompt on a machine that may be busy; its "
                       "speed varies from prompt to prompt, the benchmark's is the mean over many prompts.")
        if turn.get("kernel_rows"):
            st.caption(f"Kernel paths of the target on this CPU ({turn.get('kernel_source', 'timed')}; "
                       f"engine.generate.kernel_choice). {turn.get('kernel_rule', '')}")
            if turn.get("kernel_load"):
                st.warning(turn["kernel_load"], icon=":material/hourglass_top:")
            st.dataframe(turn["kernel_rows"], hide_index=True)
            if turn.get("kernel_untried"):
                st.caption(turn["kernel_untried"])
        elif turn.get("kernel"):
            st.caption(f"Kernel path of the target on this CPU: {turn['kernel']}.")
        curve = turn.get("cost_curve") or {}
        if curve.get(turn["k"] + 1):
            st.caption(f"The target's cost curve on this machine: one forward over {turn['k'] + 1} tokens costs "
                       f"{curve[turn['k'] + 1]:.2f}× one over 1 token. The ceiling column is the speedup if drafting "
                       "were free: the tokens of every step (a step that drafted nothing emits one token at the cost "
                       "of one) over what verifying them cost.")


def _show_turn(turn: dict, index: int) -> None:
    with st.chat_message("user"):
        st.markdown(turn["prompt"])
    with st.chat_message("assistant"):
        names = [n for n in turn["sides"] if n != "baseline"]
        for name in names:
            label = turn["sides"][name]["label"]
            identical = turn["sides"][name]["identical"]
            text, color, why = identical_badge(label, identical, turn.get("kernel_exact"), turn["temperature"])
            st.badge(text, icon=":material/check_circle:" if identical else ":material/difference:", color=color,
                     help=why)
        cols = st.columns(len(turn["sides"]))
        for col, (name, side) in zip(cols, turn["sides"].items(), strict=True):
            with col:
                st.markdown(f"**{side['title']}**")
                st.html(side["html"])
                st.caption(_metrics_line(side["metrics"], turn["explain"].get(name)))
        _why(turn, index)
        with st.expander("Step details (accepted and rejected drafts)"):
            st.caption(BLOCK_LEGEND)
            for name in names:
                side = turn["sides"][name]
                st.markdown(f"**{side['label']}**")
                if side["step_lengths"]:
                    charts.show(charts.acceptance_bars(side["step_lengths"], turn["k"], side["label"]),
                                key=f"chat_bars_{index}_{name}", filename=f"acceptance-per-step-{name}")
                st.dataframe(side["steps"], hide_index=True, width="stretch")
        show_cli(turn["cli"], label="Equivalent CLI commands")


for i, turn in enumerate(ss["chat_history"]):
    _show_turn(turn, i)

prompt = st.chat_input("Ask the target something", key="chat_prompt") or ss.pop("chat_pending", None)

if prompt:
    with st.chat_message("user"):
        st.markdown(prompt)
    with st.chat_message("assistant"), guard("Generating"):
        from ui.chat import Race, busy_note, prompt_ids, sampling

        target = resources.target(target_name)
        proposers = {"baseline": None} | {
            name: resources.proposer(fields["method"], target_name, fields["draft"], p_min=fields.get("p_min"),
                                     **({"ngram_min_match": fields["ngram_min_match"]}
                                        if "ngram_min_match" in fields else {}))
            for name, fields in settings.items()}
        curve = resources.cost_curve(target_name)
        ids = prompt_ids(target.tokenizer, _messages(prompt))
        params = sampling(target.tokenizer, max_new_tokens=int(max_new), temperature=float(temperature),
                          seed=int(seed))
        busy = busy_note()
        if busy:
            st.caption(f":material/hourglass_top: {busy}")
        titles = {"baseline": "Baseline (target alone)"} | {n: chat_ui.side_title(PROPOSERS[n], int(k), settings[n])
                                                            for n in chosen}
        cols = st.columns(len(proposers))
        holders = {}
        for col, name in zip(cols, proposers, strict=True):
            col.markdown(f"**{titles[name]}**")
            holders[name] = col.empty()
        progress = st.empty()
        race = Race(target, ids, params, proposers, int(k)).start()
        try:
            with st.spinner("Generating…", show_time=True):
                while True:
                    running = race.running
                    fraction, text = race_progress(race, {n: titles[n] for n in proposers}, int(max_new))
                    progress.progress(fraction, text=text)
                    for name, side in race.sides.items():
                        if not side.marks:
                            holders[name].html(waiting_html(race.elapsed, started=bool(side.events)))
                        elif name == "baseline":
                            holders[name].html(plain_html(side.text.text, cursor=not side.done))
                        else:
                            holders[name].html(spec_html(list(side.marks), cursor=not side.done))
                    if not running:
                        break
                    time.sleep(0.25)
            race.join()
        finally:
            race.cancel()
        sides = race.sides
        base = sides["baseline"]
        cli = generate_commands(prompt, {"target": target_name, "k": int(k), "max_new_tokens": int(max_new),
                                         "temperature": float(temperature), "seed": int(seed)},
                                settings)
        profiles = {name: side.profile() for name, side in sides.items()}
        rows = explain(profiles, k=int(k), cost_curve=curve, labels={n: PROPOSERS[n] for n in chosen})
        kernel = target.extra.get("kernel")
        turn = {"prompt": prompt, "k": int(k), "draft": draft if "draft" in chosen else None,
                "temperature": float(temperature), "baseline": base.text.text,
                "cost_curve": curve, "busy": busy, "explain": rows, "cli": cli,
                "kernel": target.extra.get("kernel_summary"), "kernel_exact": kernel_exact(kernel),
                "kernel_rows": kernel_rows(kernel), "kernel_rule": kernel_rule(kernel),
                "kernel_load": kernel_load_note(kernel, target_name), "kernel_untried": kernel_untried(kernel),
                "kernel_source": kernel_source(kernel),
                "sides": {name: {"label": PROPOSERS.get(name, "baseline"), "title": titles[name],
                                 "html": (plain_html(side.text.text) if name == "baseline" else spec_html(side.marks)),
                                 "identical": side.ids == base.ids,
                                 "metrics": side.summary() | {"decode_tokens_per_s": (
                                     profiles[name].tokens / profiles[name].decode_s
                                     if profiles[name].decode_s > 0 else None)},
                                 "step_lengths": side.step_lengths(), "steps": side.step_rows()}
                          for name, side in sides.items()}}
        ss["chat_history"].append(turn)
        st.rerun()  # draw the finished turn from the history (badges, explanation, details)

if not ss["chat_history"] and not prompt:
    show_cli(["generate", EXAMPLES[0], "--method", "ngram", "--target", target_name, "--k", "3"])
