"""The sidebar frame: active target and draft, where models run, and the jobs running now."""

from __future__ import annotations

import streamlit as st

from ui import resources, state
from ui.errors import guard
from ui.jobs import STATE_ICONS, all_jobs


def render() -> None:
    with st.sidebar:
        st.markdown("### Active models")
        target = state.active_target()
        draft = state.active_draft()
        st.markdown(f"**Target** · `{state.short(target)}`", help=target)
        if draft:
            origin = "shipped" if state.draft_choice() == state.AUTO else "chosen"
            st.markdown(f"**Draft** · `{state.short(draft)}` ({origin})", help=draft)
        else:
            st.markdown("**Draft** · none — n-gram only", help="no draft selected and no shipped draft for this "
                        "target yet; pick one on the Models page")
        st.button("Reset saved choices", key="app_reset", icon=":material/restart_alt:", on_click=state.reset_settings,
                  help="The target, draft and Demo chat settings are kept across reloads and restarts in "
                  f"`{state.settings_path()}`; this forgets them (the built-in target and its shipped draft again).")
        with guard("Detecting the device"):
            info = resources.device_info()
            icon = ":material/memory:" if info["kind"] == "GPU" else ":material/developer_board:"
            extra = f", {info['memory_gib']} GiB" if info["kind"] == "GPU" else f", {info['threads']} torch threads"
            st.markdown(f"{icon} **Device** · {info['kind']}: {info['name']}{extra}", help=f"torch {info['torch']}")
            if info["kind"] == "CPU":
                kernel = resources.kernel_choice(target)
                path = (kernel.path + (" · :orange[measured under load]" if kernel.loaded else "") if kernel
                        else "measured at the target's first load")
                st.markdown(f":material/speed: **Kernels** · {path}", help=kernel.summary() if kernel else
                            "each kernel path is timed on this CPU when the target is first loaded; the fastest "
                            "row-exact one (a one-token step plus a verification) wins")
        running_jobs()


@st.fragment(run_every=3)
def running_jobs() -> None:
    st.markdown("### Running jobs")
    with guard("Listing jobs"):
        running = [j for j in all_jobs() if j.running]
        if not running:
            st.caption("none")
        for job in running[:8]:
            pct = f" {job.status.progress:.0%}" if job.status.progress is not None else ""
            st.markdown(f"{STATE_ICONS.get(job.status.state, '')} **{job.kind}**{pct} · `{job.id}`")
            if job.status.message:
                st.caption(job.status.message[:90])
        if len(running) > 8:
            st.caption(f"and {len(running) - 8} more")
        st.page_link("pages/jobs.py", label="All jobs", icon=":material/list:")
