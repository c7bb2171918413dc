"""Jobs: every background job under runs/ (rebuilt from disk), with its command, status, log and a stop button."""

import streamlit as st

from ui.cli import show_cli
from ui.errors import guard
from ui.jobs import STATES, all_jobs, job_details, jobs_table, runs_root

st.title("Jobs")
st.caption(f"Every `python -m engine ...` started from the app or the CLI runs in its own folder under "
           f"`{runs_root()}` (command, status.json written by the job itself, logs, metrics). This list is rebuilt "
           "from disk, so it survives a browser refresh and an app restart.")


@st.fragment(run_every=3.0)
def jobs_view() -> None:
    with guard("Listing jobs"):
        jobs = all_jobs()
        if not jobs:
            st.info("No jobs yet.", icon=":material/work_history:")
            return
        kinds = sorted({j.kind for j in jobs})
        c1, c2 = st.columns(2)
        kind = c1.multiselect("Kinds", kinds, key="jobs_kinds", placeholder="all kinds")
        states = c2.multiselect("States", STATES, key="jobs_states", placeholder="all states")
        shown = [j for j in jobs if (not kind or j.kind in kind) and (not states or j.status.state in states)]
        jobs_table(shown)
        if shown:
            ids = [j.id for j in shown]
            pick = st.selectbox("Details of", ids, key="jobs_pick",
                                index=ids.index(st.session_state["jobs_pick"])
                                if st.session_state.get("jobs_pick") in ids else 0)
            job = next(j for j in shown if j.id == pick)
            job_details(job, key="jobs_detail", log_lines=60)
            if job.metrics():
                with st.expander(f"metrics.jsonl ({len(job.metrics())} rows)"):
                    st.dataframe(job.metrics()[-200:], hide_index=True)


jobs_view()
show_cli("python -m engine jobs              # list\n"
         "python -m engine jobs show JOB_ID  # command, state, log\n"
         "python -m engine jobs stop JOB_ID  # SIGTERM to its process group", label="Equivalent CLI commands")
