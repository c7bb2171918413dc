"""Demo chat: one prompt, the baseline and the speculative answer streamed side by side with acceptance colouring."""

import time

import streamlit as st

from ui import charts, resources, state
from ui.cli import command, show_cli
from ui.errors import guard
from ui.tokens import legend_html, plain_html, spec_html

st.title("Demo chat")
st.caption("The target answers twice: alone (baseline) and with a proposer drafting tokens it verifies. "
           "With temperature 0 both answers must be identical; speculative decoding only changes the speed.")

ss = st.session_state
ss.setdefault("chat_history", [])
target_name = state.active_target()
draft = state.active_draft()
EXAMPLES = ["Repeat this sentence three times: The cat sat on the mat.",
            "Write a Python function that adds two numbers.",
            "What is speculative decoding? Answer in two sentences."]
PROPOSERS = {"draft": "Draft model", "ngram": "n-gram (prompt lookup)"}

# -- controls -------------------------------------------------------------------------------------
with st.container(border=True):
    c1, c2, c3, c4, c5 = st.columns([2, 1, 1, 1, 1])
    options = list(PROPOSERS) if draft else ["ngram"]
    if ss.get("chat_proposer") not in options:
        ss["chat_proposer"] = options[0]
    with c1:
        proposer_name = st.radio("Proposer", options, key="chat_proposer", horizontal=True,
                                 format_func=PROPOSERS.get,
                                 help="Draft: the active draft model. n-gram: copies continuations of earlier text "
                                 "(no model; works on repetitive prompts).")
        if not draft:
            st.caption("No draft for this target yet (the shipped one is still being trained): n-gram only. "
                       "Pick a draft on the Models page.")
        else:
            st.caption(f"Draft: `{state.short(draft, 60)}`")
    with c2:
        k = st.slider("k (drafts per step)", 1, 8, 3, key="chat_k")
    with c3:
        temperature = st.slider("Temperature", 0.0, 1.5, 0.0, 0.1, key="chat_temperature",
                                help="0 = greedy: both answers identical. Above 0 sampling is lossless in "
                                "distribution, so single answers may differ.")
    with c4:
        max_new = st.number_input("Max new tokens", 8, 1024, 96, 8, key="chat_max_new_tokens")
    with c5:
        seed = st.number_input("Seed", 0, 2**31 - 1, 0, key="chat_seed")
    c6, c7 = st.columns([3, 1])
    with c6:
        multi_turn = st.toggle("Continue the conversation (earlier turns are context)", key="chat_multi_turn",
                               value=False)
    with c7:
        if st.button("Clear chat", key="chat_clear", icon=":material/delete_sweep:", disabled=not ss["chat_history"]):
            ss["chat_history"] = []
            st.rerun()

st.html(legend_html())
st.caption("Examples:")
ex_cols = st.columns(len(EXAMPLES))
for i, (col, text) in enumerate(zip(ex_cols, EXAMPLES)):
    if col.button(text, key=f"chat_example_{i}", width="stretch"):
        ss["chat_pending"] = text


def _messages(prompt: str) -> list[dict]:
    msgs = []
    if multi_turn:
        for turn in ss["chat_history"]:
            msgs += [{"role": "user", "content": turn["prompt"]}, {"role": "assistant", "content": turn["baseline"]}]
    return msgs + [{"role": "user", "content": prompt}]


def _metrics_line(side: dict, base_tps: float | None) -> str:
    parts = [f"{side['tokens']} tokens", f"{side['tokens_per_s']:.1f} tokens/s"]
    if side.get("first_token_s") is not None:
        parts.append(f"first token {side['first_token_s']:.2f} s")
    if side.get("mean_acceptance_length"):
        parts.append(f"mean acceptance length {side['mean_acceptance_length']:.2f}")
    if base_tps:
        parts.append(f"speedup **{side['tokens_per_s'] / base_tps:.2f}×**")
    return " · ".join(parts)


def _show_turn(turn: dict, index: int) -> None:
    with st.chat_message("user"):
        st.markdown(turn["prompt"])
    with st.chat_message("assistant"):
        if turn["identical"]:
            st.badge("Identical output: speculative = baseline", icon=":material/check_circle:", color="green")
        else:
            st.badge("Outputs differ", icon=":material/difference:", color="orange",
                     help="Expected with temperature > 0 (the same distribution, different samples).")
        b, s = st.columns(2)
        with b:
            st.markdown("**Baseline** (target alone)")
            st.html(plain_html(turn["baseline"]))
            st.caption(_metrics_line(turn["base_metrics"], None))
        with s:
            st.markdown(f"**Speculative** ({PROPOSERS[turn['proposer']]}, k={turn['k']})")
            st.html(turn["spec_html"])
            st.caption(_metrics_line(turn["spec_metrics"], turn["base_metrics"]["tokens_per_s"]))
        if turn["step_lengths"]:
            st.plotly_chart(charts.acceptance_bars(turn["step_lengths"], turn["k"]), key=f"chat_bars_{index}")
        with st.expander("Step details (accepted and rejected drafts)"):
            st.dataframe(turn["steps"], hide_index=True, width="stretch")
        show_cli(turn["cli"], label="Equivalent CLI commands")


for i, turn in enumerate(ss["chat_history"]):
    _show_turn(turn, i)

prompt = st.chat_input("Ask the target something", key="chat_prompt") or ss.pop("chat_pending", None)

if prompt:
    with st.chat_message("user"):
        st.markdown(prompt)
    with st.chat_message("assistant"), guard("Generating"):
        target = resources.target(target_name)
        proposer = resources.proposer(proposer_name, target_name, draft)
        from ui.chat import prompt_ids, race, sampling

        ids = prompt_ids(target.tokenizer, _messages(prompt))
        params = sampling(target.tokenizer, max_new_tokens=int(max_new), temperature=float(temperature),
                          seed=int(seed))
        b, s = st.columns(2)
        b.markdown("**Baseline** (target alone)")
        s.markdown(f"**Speculative** ({PROPOSERS[proposer_name]}, k={k})")
        holders = {"baseline": b.empty(), "speculative": s.empty()}
        last_draw = {"baseline": 0.0, "speculative": 0.0}

        def draw(side) -> None:
            now = time.monotonic()
            if not side.done and now - last_draw[side.name] < 0.15:
                return
            last_draw[side.name] = now
            if side.name == "baseline":
                holders["baseline"].html(plain_html(side.text.text, cursor=not side.done))
            else:
                holders["speculative"].html(spec_html(side.marks, cursor=not side.done))

        base, spec = race(target, ids, params, proposer, int(k), on_event=draw)
        argv = ["generate", prompt, "--target", target_name, "--k", str(k), "--max-new-tokens", str(max_new),
                "--temperature", str(temperature), "--seed", str(seed)]
        cli = "\n".join([command(argv[:2] + ["--method", "baseline"] + argv[2:]),
                         command(argv[:2] + ["--method", proposer_name] + argv[2:]
                                 + (["--draft", draft] if proposer_name == "draft" else []))])
        turn = {"prompt": prompt, "proposer": proposer_name, "k": int(k), "baseline": base.text.text,
                "spec_html": spec_html(spec.marks), "identical": base.ids == spec.ids,
                "base_metrics": base.summary(), "spec_metrics": spec.summary(),
                "step_lengths": spec.step_lengths(), "steps": spec.step_rows(), "cli": cli}
        ss["chat_history"].append(turn)
        st.rerun()  # draw the finished turn from the history (badge, bars, details)

if not ss["chat_history"] and not prompt:
    show_cli(["generate", EXAMPLES[0], "--method", "ngram", "--target", target_name, "--k", "3"])
