"""Serve: run the draft with real vLLM (a managed server job), chat through it, watch acceptance from /metrics."""

import time

import streamlit as st

from ui import charts, report, serving, state
from ui.cli import show_cli
from ui.errors import guard
from ui.forms import submit_and_launch
from ui.jobs import job_panel, job_selector, launch

st.title("Serve")
st.caption("A real server serving the target with the draft: vLLM's OpenAI server (from its own environment, "
           "`.venv-vllm`; on GPUs) or llama.cpp's llama-server (built once; on CPUs). It runs as a job: it keeps "
           "serving across page changes, refreshes and app restarts until you stop it.")

ss = st.session_state
draft, target = state.active_draft(), state.active_target()
if "serve_port_default" not in ss:
    with guard("Finding a free port"):
        ss["serve_port_default"] = serving.free_port()

start_tab, use_tab = st.tabs(["Start a server", "Use a running server"])
with start_tab:
    engine_name = st.radio("Engine", ["vLLM", "llama.cpp"], horizontal=True, key="serve_engine",
                           help="vLLM: GPUs (its CPU build refuses some draft types); llama.cpp: CPUs, with the "
                           f"draft types it runs ({', '.join(serving.llamacpp_types())}) exported to GGUF.")


def vllm_start() -> None:
    """The vLLM half of the start tab: its environment, the form, the command."""
    env = None
    with guard("Checking the vLLM environment"):
        env = serving.vllm_env()
    if env is None:
        st.warning("vLLM is not installed yet (it lives in its own virtual environment, `.venv-vllm`: the CPU build "
                   "on CPU machines, the CUDA build on GPUs). Installing takes several minutes.",
                   icon=":material/download:")
        if st.button("Install vLLM", key="serve_install", icon=":material/download:"):
            job = launch(["serve", "--install-only"], kind="serve", name="install")
            if job:
                ss["serve_install_job"] = job.id
        if ss.get("serve_install_job"):
            job_panel(ss["serve_install_job"], key="serve_install_panel")
        show_cli(["serve", "--install-only"])
    else:
        st.caption(f"Runs vLLM {env.vllm_version} ({env.flavor} build, torch {env.torch_version}) from `{env.path}`; "
                   f"drafts are checked with {report.RULES_LABEL}'s rules (Config builder, Models).")

    with st.form("serve_form", border=False):
        c1, c2, c3 = st.columns(3)
        with_draft = c1.toggle("Serve with the active draft", value=bool(draft), key="serve_with_draft",
                               disabled=not draft, help=f"Draft: {draft or 'none'}")
        form = c2.selectbox("Form", serving.forms(draft if with_draft else None), key="serve_form_kind",
                            help="auto: `vllm serve <draft>` (vLLM reads the verifier from the draft's config); "
                            "explicit: the target with --speculative-config.")
        k = c3.number_input("k (0 = the draft's own)", 0, 16, 0, key="serve_k")
        c4, c5, c6 = st.columns(3)
        port = c4.number_input("Port", 1024, 65535, ss.get("serve_port_default") or 8000, key="serve_port")
        max_len = c5.number_input("Max model length", 128, 131072, 2048, key="serve_max_len")
        flavor = serving.vllm_flavor(env)
        dtype = c6.selectbox("dtype", serving.DTYPES, index=serving.dtype_index(flavor), key="serve_dtype")
        if note := serving.dtype_note(dtype, flavor):
            st.caption(note)
        c7, c8 = st.columns([2, 1])
        fields = c7.text_input("More speculative_config fields (JSON)", "", key="serve_spec_fields",
                               placeholder='{"rejection_sample_method": "block"}', disabled=not with_draft,
                               help="Checked by vLLM's rules before the server starts; a lossy one (synthetic) is "
                               "labelled LOSSY in the job's log.")
        metrics = c8.selectbox("Per-request acceptance metrics", ["none", "summary", "detailed"],
                               key="serve_request_metrics", disabled=not with_draft,
                               help=serving.option_help("per_request_spec_decode_metrics"))
        explicit_target = target if (form == "explicit" or not (with_draft and draft)) else None
        try:
            argv = serving.serve_argv({"draft": draft if with_draft else None, "target": explicit_target,
                                       "k": int(k) or None, "form": form, "port": int(port),
                                       "max_model_len": int(max_len), "dtype": dtype,
                                       "speculative_fields": (fields or "").strip() or None,
                                       "per_request_spec_decode_metrics": metrics})
        except ValueError as exc:
            argv = None
            st.error(f"Cannot serve with these values: {exc}", icon=":material/error:")
        submit_and_launch("Start the server", argv, kind="serve", job_key="serve_job", name=str(port),
                          icon=":material/play_arrow:", disabled=env is None)
    if argv:
        show_cli(argv)
    if draft and with_draft:
        with guard("Deriving the vLLM command"):
            from ui.report import validate

            rep = validate(draft, check_weights=False)
            if rep.serve_commands:
                st.markdown("**The same server anywhere vLLM runs**")
                for line in rep.serve_commands:
                    st.code(line, language="bash", wrap_lines=True)


def llamacpp_start() -> None:
    """The llama.cpp half of the start tab: its build, the form, the command."""
    build = None
    with guard("Checking the llama.cpp build"):
        build = serving.llamacpp_build()
    if build is None:
        st.warning("llama.cpp is not built on this machine yet: llama-server is compiled once from its pinned source "
                   "(the PyPI sdist of llama-cpp-python), about 5-10 minutes on 2 cores, and cached outside the "
                   "clone.", icon=":material/build:")
        if st.button("Build llama.cpp", key="serve_llamacpp_build", icon=":material/build:"):
            job = launch(["serve", "--engine", "llama.cpp", "--install-only"], kind="serve", name="llamacpp-build")
            if job:
                ss["serve_llamacpp_build_job"] = job.id
        if ss.get("serve_llamacpp_build_job"):
            job_panel(ss["serve_llamacpp_build_job"], key="serve_llamacpp_build_panel")
    else:
        st.caption(f"Runs llama-server from `{build.path}` (llama.cpp of llama-cpp-python {build.version}); the "
                   "draft is exported to GGUF by llama.cpp's own converter, once.")
    with st.form("serve_llamacpp_form", border=False):
        c1, c2, c3 = st.columns(3)
        with_draft = c1.toggle("Serve with the active draft", value=bool(draft), key="serve_lc_with_draft",
                               disabled=not draft, help=f"Draft: {draft or 'none'}")
        k = c2.number_input("k (0 = the draft's own)", 0, 16, 0, key="serve_lc_k")
        port = c3.number_input("Port", 1024, 65535, ss.get("serve_port_default") or 8000, key="serve_lc_port")
        c4, c5, c6 = st.columns(3)
        gguf_target = c4.selectbox("Target GGUF", ["f32", "bf16", "f16", "q8_0", "shipped"], key="serve_lc_target",
                                   help=serving.option_help("gguf_target"))
        gguf_draft = c5.selectbox("Draft GGUF", ["f32", "bf16", "f16", "q8_0"], key="serve_lc_draft",
                                  help=serving.option_help("gguf_draft"))
        ctx = c6.number_input("Context length", 128, 131072, 2048, key="serve_lc_ctx")
        c7, c8 = st.columns(2)
        p_min = c7.number_input("Draft only above this probability (0 = always)", 0.0, 1.0, 0.0, 0.05,
                                key="serve_lc_pmin", help=serving.option_help("p_min"))
        ngram = c8.selectbox("n-gram proposer", ["none", "ngram-simple", "ngram-mod", "ngram-map-k"],
                             key="serve_lc_ngram", help=serving.option_help("ngram"))
        try:
            argv = serving.llamacpp_argv(draft=draft if with_draft else None, k=int(k) or None, port=int(port),
                                         ctx=int(ctx), gguf_target=gguf_target, gguf_draft=gguf_draft,
                                         p_min=float(p_min) or None, ngram=None if ngram == "none" else ngram)
        except ValueError as exc:
            argv = None
            st.error(f"Cannot serve with these values: {exc}", icon=":material/error:")
        submit_and_launch("Start the server", argv, kind="serve", job_key="serve_job", name=str(port),
                          icon=":material/play_arrow:", disabled=build is None)
    if argv:
        show_cli(argv)


with start_tab:
    if engine_name == "llama.cpp":
        llamacpp_start()
    else:
        vllm_start()

with use_tab:
    servers = []
    with guard("Listing servers"):
        servers = serving.servers()
    if not servers:
        st.info("No server has been started yet.", icon=":material/dns:")
    else:
        job = job_selector("Server", servers, key="serve_watch", prefer_key="serve_job")
        pick = job.id
        info = serving.server_info(job)
        left, right = st.columns([3, 2])
        with left:
            job_panel(pick, key="serve_panel", log_lines=20)
            if info.get("vllm_serve"):
                st.markdown("**The vLLM command** (what to run elsewhere)")
                st.code(info["vllm_serve"], language="bash", wrap_lines=True)
            if info.get("llama_server"):
                st.markdown("**The llama-server command** (what to run elsewhere)")
                st.code(info["llama_server"], language="bash", wrap_lines=True)
            if info.get("full_command"):
                st.markdown("**The exact process started here** (from `vllm.log`)")
                st.code(info["full_command"], language="bash", wrap_lines=True)
        url = info.get("url")
        ready = bool(info.get("ready")) and job.running
        with right:
            if not ready:
                st.info("Chat and metrics appear when the server is ready.", icon=":material/hourglass_top:")
            else:
                @st.fragment(run_every=2.0)
                def live_acceptance() -> None:
                    with guard("Reading /metrics"):
                        acc = serving.acceptance(url)
                        if acc is None:
                            st.caption("This server runs without a draft: no spec-decode counters.")
                            return
                        c1, c2, c3 = st.columns(3)
                        c1.metric("drafts", acc["num_drafts"])
                        tau = acc["mean_acceptance_length"]
                        c2.metric("tokens per step", f"{tau:.2f}" if tau else "–",  # a label that fits uncut
                                  help="Mean acceptance length (vLLM's definition): tokens each drafting step "
                                       "emits, the bonus token included.")
                        rate = acc["acceptance_rate"]
                        c3.metric("acceptance rate", f"{rate:.0%}" if rate is not None else "–")
                        charts.show(charts.per_position_bars(acc["per_position_acceptance"]),
                                    key="serve_acceptance_chart", filename="vllm-acceptance-per-position")

                live_acceptance()
        if ready:
            st.subheader("Chat through the server", anchor=False)
            history = ss.setdefault("serve_history", [])
            for turn in history:
                with st.chat_message(turn["role"]):
                    st.markdown(turn["content"])
                    if turn.get("meta"):
                        st.caption(turn["meta"])
            c1, c2 = st.columns(2)
            max_tokens = c1.number_input("Max tokens", 1, 4096, 128, key="serve_chat_max_tokens")
            temperature = c2.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="serve_chat_temperature")
            prompt = st.chat_input("Message the served model", key="serve_chat_prompt")
            if prompt:
                with guard("Chatting with the server"):
                    msgs = [{"role": t["role"], "content": t["content"]} for t in history]
                    msgs.append({"role": "user", "content": prompt})
                    t0 = time.perf_counter()
                    answer = serving.chat(url, msgs, max_tokens=int(max_tokens), temperature=float(temperature))
                    meta = (f"{answer.completion_tokens} tokens in {time.perf_counter() - t0:.2f} s · "
                            f"{answer.tokens_per_s:.1f} tokens/s · finish: {answer.finish_reason}")
                    history += [{"role": "user", "content": prompt},
                                {"role": "assistant", "content": answer.text, "meta": meta}]
                    st.rerun()
            if history and st.button("Clear chat", key="serve_clear"):
                ss["serve_history"] = []
                st.rerun()
