"""Start: what the workbench does, the workflow (target -> data -> train -> evaluate -> serve), where the active
target stands in each step, and one button per step."""

import streamlit as st

from ui import bench, catalog, resources, state
from ui import start as start_ui
from ui.cli import show_cli
from ui.errors import guard
from ui.jobs import rerun_on_job_change

st.title("Speculators Workbench")
st.markdown("Make a large language model answer **faster without changing a single token**: a small *draft* model "
            "proposes the next few tokens and the large *target* checks them all in one pass (speculative decoding). "
            "This workbench trains such drafts, checks they load in vLLM (the speculators format), measures how "
            "much faster they make the target on this machine, and serves them.")

target, draft = state.active_target(), state.active_draft()
steps: list[start_ui.Step] = []
with guard("Reading where each step stands"):
    problem = catalog.target_problem(target)
    path = None
    if problem is None:
        with guard("Resolving the target"):
            path = resources.target_ref(target).path
    steps = start_ui.steps(target, draft, problem, path)

if steps:
    nxt = start_ui.next_step(steps)
    speed = bench.draft_speed(draft)
    with st.container(border=True):
        st.markdown(f"**Where to start** · active target `{state.short(target)}`, draft "
                    f"`{state.short(draft) if draft else 'none (n-gram only)'}`")
        if draft and speed:
            st.markdown(bench.draft_speed_text(speed))
        st.markdown("The quickest look: the **Demo chat** answers one prompt with and without the draft, side by side. "
                    f"Next step for this target: **{nxt.title[3:]}** — {nxt.what}")
        c1, c2 = st.columns(2)
        c1.page_link("pages/demo_chat.py", label="Try the Demo chat", icon=":material/chat:")
        c2.page_link(nxt.page, label=f"Next: {nxt.action}", icon=nxt.icon)

    st.subheader("The workflow", anchor=False)
    cols = st.columns(len(steps))
    for col, step in zip(cols, steps, strict=True):
        with col, st.container(border=True, height="stretch"):
            st.markdown(f"{step.mark} **{step.title}**")
            st.caption(step.what)
            st.markdown(step.status)
            st.page_link(step.page, label=step.action, icon=step.icon)
    st.caption("Every page shows the `python -m engine ...` command that does the same from a terminal; long work "
               "runs as a job (the sidebar lists the running ones, the Jobs page all of them) and survives a browser "
               "refresh.")
show_cli(["targets"])
rerun_on_job_change(key="start")  # the steps follow jobs that start, end or serve, without a reload
