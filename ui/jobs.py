"""Job panels over engine.jobs: launch `python -m engine ...` in the background and watch it from disk.

Everything shown is rebuilt from `runs/<id>/` on each poll, so a browser refresh or an app restart loses nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path

import streamlit as st

from engine import jobs as engine_jobs
from ui.cli import command
from ui.errors import guard

# Material icons (they render everywhere markdown does, no emoji font needed) and colours per state.
STATE_ICONS = {"queued": ":material/schedule:", "running": ":material/autorenew:", "done": ":material/check_circle:",
               "failed": ":material/error:", "stopped": ":material/stop_circle:"}
STATE_COLOURS = {"queued": "gray", "running": "blue", "done": "green", "failed": "red", "stopped": "orange"}
STATES = list(STATE_ICONS)


def state_md(state: str) -> str:
    """A job state as coloured markdown with its icon."""
    return f":{STATE_COLOURS.get(state, 'gray')}[{STATE_ICONS.get(state, '')} **{state}**]"
POLL_S = 2.0


def launch(argv: Sequence[str], *, kind: str | None = None, name: str | None = None,
           launcher: Sequence[str] | None = None) -> engine_jobs.Job | None:
    """Start a job (through `launcher`, e.g. torchrun, if given); errors become a message. Returns the job or None."""
    with guard("Starting the job"):
        job = engine_jobs.launch([str(a) for a in argv], kind=kind, name=name, launcher=launcher)
        st.toast(f"Started {job.kind} job {job.id}", icon=":material/rocket_launch:")
        return job
    return None


def all_jobs(kinds: Sequence[str] | None = None) -> list[engine_jobs.Job]:
    jobs = engine_jobs.list_jobs()
    return [j for j in jobs if kinds is None or j.kind in kinds]


def find(job_id: str | None) -> engine_jobs.Job | None:
    if not job_id:
        return None
    return engine_jobs.load_job(engine_jobs.runs_dir() / job_id)


def label(job: engine_jobs.Job) -> str:
    when = time.strftime("%m-%d %H:%M", time.localtime(job.created))
    return f"{job.id} · {job.kind} · started {when}"


def argv_value(job: engine_jobs.Job, flag: str) -> str | None:
    """The value given to `flag` on the job's command line, if any."""
    argv = job.argv
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def failure_parts(message: str) -> tuple[str, str | None]:
    """A failed job's message ("error: what" lines, then "Fix: how") split into (what, how)."""
    what, how = [], []
    for line in (message or "").splitlines():
        line = line.strip()
        if line.lower().startswith("fix:"):
            how.append(line[4:].strip())
        elif line:
            (how if how else what).append(line.removeprefix("error:").strip())
    return " ".join(what) or "the job failed without a message (see its log)", " ".join(how) or None


def status_line(job: engine_jobs.Job) -> None:
    s = job.status
    if s.state == "failed":  # the error on its own, wrapped and readable, with what to do
        st.markdown(f"{state_md(s.state)} · `{job.id}`")
        what, how = failure_parts(s.message)
        st.error(f"**{job.kind} failed:** {what}", icon=":material/error:")
        if how:
            st.info(f"**What to do:** {how}", icon=":material/lightbulb:")
        return
    st.markdown(f"{state_md(s.state)} · `{job.id}`" + (f" — {s.message}" if s.message else ""))
    if s.progress is not None:
        st.progress(min(1.0, max(0.0, s.progress)), text=progress_text(s, kind=job.kind, job_id=job.id))
    elif job.running and s.started:
        st.caption(f"running for {engine_jobs.duration_text(time.time() - s.started)}")


def progress_text(s: engine_jobs.JobStatus, now: float | None = None, *, kind: str | None = None,
                  job_id: str | None = None) -> str:
    """"42% · 3 min 10 s so far · about 4 min 22 s left": the time left as `time_left` can back it."""
    p = min(1.0, max(0.0, s.progress or 0.0))
    parts = [f"{p:.0%}"]
    if s.started:
        running = s.state in ("queued", "running")
        end = (now or time.time()) if running else (s.updated or now or time.time())
        elapsed = max(0.0, end - s.started)
        parts.append(f"{engine_jobs.duration_text(elapsed)} so far" if running
                     else f"took {engine_jobs.duration_text(elapsed)}")
        if running and p < 1.0:
            left = time_left(s, now or time.time(), kind=kind, job_id=job_id)
            parts += [left] if left else []
    return " · ".join(parts)


FIRST_RUN = "first run: measuring"  # a phase that never ran on this machine: no figure nothing backs


def time_left(s: engine_jobs.JobStatus, now: float, *, kind: str | None, job_id: str | None) -> str | None:
    """The time left of a running job, learned from this machine's own runs: the phase's own estimate from its rate
    is in its message (engine.jobs.left_text); before it has one, what the phase took in the last job of this kind
    here (scaled to its units), counted down; the phases still planned take what they took then, scaled to their
    units. A phase that never ran here is "first run: measuring", not a figure nothing backs."""
    phase = s.phases[-1] if s.phases and s.phases[-1].get("end") is None else None
    if phase is None or kind is None:
        return FIRST_RUN
    rest, unknown = _rest(s, kind, phase["name"], job_id)
    then = f"; then {unknown[0]} ({FIRST_RUN})" if unknown else ""
    if phase.get("left_s") is not None:  # the phase's own figure from its rate, then what the rest took
        left = max(0.0, phase["left_s"] - (now - phase.get("left_at", now))) + rest
        return f"about {engine_jobs.duration_text(left)} left" + (" (as your last run took)" if rest else "") + then
    if "left" in s.message:  # the phase's own figure is in its message (a job that keeps no figure)
        more = f"then about {engine_jobs.duration_text(rest)} more (as your last run took)" if rest >= 1 else ""
        return (more + then).removeprefix("; ") or None
    learned = _learned(str(engine_jobs.runs_dir()), kind, phase["name"], phase.get("units"), job_id)
    if learned is None:
        return FIRST_RUN
    left = learned[0] - (now - phase["start"])
    if left < 0:
        longer = f"longer than your last run's {engine_jobs.duration_text(learned[0])} for this phase"
        return (f"about {engine_jobs.duration_text(rest)} left after this phase ({longer})" if rest >= 1
                else longer) + then
    return f"about {engine_jobs.duration_text(left + rest)} left (as your last run took)" + then


def _rest(s: engine_jobs.JobStatus, kind: str, phase: str, job_id: str | None) -> tuple[float, list[str]]:
    """(seconds, phases never run here) after the current phase: its planned phases, else what followed it in the
    last job of this kind."""
    root = str(engine_jobs.runs_dir())
    if s.plan:
        return _learned_plan(root, kind, tuple((p["name"], p.get("units")) for p in s.plan), job_id)
    rest = _learned(root, kind, phase, None, job_id, after=True)
    return (rest[0] if rest else 0.0), []


@st.cache_data(ttl=15, show_spinner=False)
def _learned(root: str, kind: str, phase: str, units: int | None, job_id: str | None,
             after: bool = False) -> tuple[float, str] | None:
    """engine.jobs.learned_seconds / learned_rest over the runs folder `root`, read at most every 15 s."""
    if after:
        return engine_jobs.learned_rest(kind, phase, root=Path(root), exclude=job_id)
    return engine_jobs.learned_seconds(kind, phase, units, root=Path(root), exclude=job_id)


@st.cache_data(ttl=15, show_spinner=False)
def _learned_plan(root: str, kind: str, plan: tuple, job_id: str | None) -> tuple[float, list[str]]:
    """engine.jobs.learned_plan over the runs folder `root`, read at most every 15 s."""
    return engine_jobs.learned_plan(kind, plan, root=Path(root), exclude=job_id)


def stop_button(job: engine_jobs.Job, *, key: str, label: str = "Stop", help: str | None = None) -> None:
    if job.running and st.button(label, key=key, icon=":material/stop_circle:",
                                 help=help or "SIGTERM to the job's process group (trainers save a checkpoint)"):
        with guard("Stopping the job"):
            if engine_jobs.stop(job):
                st.toast(f"Sent SIGTERM to {job.id}", icon=":material/stop_circle:")
            else:
                st.toast(f"{job.id} had already finished", icon=":material/info:")


def job_details(job: engine_jobs.Job, *, key: str, log_lines: int = 25, show_log: bool = True) -> None:
    """Status, progress, the exact command, the log tail and a stop button."""
    status_line(job)
    st.code(command(job.argv), language="bash", wrap_lines=True)
    if show_log:
        log = job.log_tail(log_lines)
        with st.expander("Log (stdout.log)", expanded=job.status.state == "failed"):
            st.code(log or "(empty so far)", language="text", wrap_lines=True)
    if job.status.result:
        with st.expander("Result (status.json)"):
            st.json(job.status.result)
    stop_button(job, key=f"{key}_stop")


def milestone(job: engine_jobs.Job) -> tuple[str, str, bool]:
    """What a page shows differently once it changes: the job, its state, and whether its server is ready."""
    return job.id, job.status.state, bool(job.status.result.get("ready"))


def changed(seen: MutableMapping, key: str, now: object) -> bool:
    """Whether `now` differs from what `seen[key]` held at the last poll (never at the first); remembers `now`."""
    previous, seen[key] = seen.get(key), now
    return previous is not None and previous != now


def job_panel(job_id: str, *, key: str, log_lines: int = 25, show_log: bool = True) -> None:
    """A self-refreshing panel for one job; the whole page reruns once when the job's state changes (it starts,
    finishes, or its server becomes ready), so what the page shows from the job follows without a reload."""

    @st.fragment(run_every=POLL_S)
    def panel() -> None:
        with guard("Reading the job"):
            job = find(job_id)
            if job is None:
                st.warning(f"job {job_id} is not under {engine_jobs.runs_dir()} any more")
                return
            job_details(job, key=key, log_lines=log_lines, show_log=show_log)
            if changed(st.session_state, f"{key}_seen_state", milestone(job)):
                st.rerun(scope="app")  # let the page show the job's results, or the ready server's chat

    panel()


def rerun_on_job_change(kinds: Sequence[str] | None = None, *, key: str) -> None:
    """Polls the jobs of these kinds (all by default) and reruns the page when one starts, ends or becomes ready;
    draws nothing."""

    @st.fragment(run_every=POLL_S)
    def watch() -> None:
        with guard("Reading the jobs"):
            if changed(st.session_state, f"{key}_jobs_seen", sorted(milestone(j) for j in all_jobs(kinds))):
                st.rerun(scope="app")

    watch()


def jobs_table(jobs: Sequence[engine_jobs.Job]) -> None:
    import pandas as pd

    rows = [{"job": j.id, "kind": j.kind, "state": j.status.state,
             "progress": j.status.progress, "message": j.status.message[:120],
             "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.created))} for j in jobs]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={"progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0)})


def runs_root() -> Path:
    return engine_jobs.runs_dir()


def job_selector(title: str, jobs: Sequence[engine_jobs.Job], *, key: str, prefer_key: str) -> engine_jobs.Job:
    """A selectbox of jobs that jumps to a newly launched one (its id in `prefer_key`) and never holds a stale id."""
    ids = [j.id for j in jobs]
    by_id = {j.id: j for j in jobs}
    prefer = st.session_state.get(prefer_key)
    if prefer in ids and st.session_state.get(key + "_followed") != prefer:
        st.session_state[key] = prefer
        st.session_state[key + "_followed"] = prefer
    if st.session_state.get(key) not in ids:
        st.session_state[key] = ids[0]
    return by_id[st.selectbox(title, ids, key=key, format_func=lambda i: label(by_id[i]))]


def watch_jobs(kinds: Sequence[str], title: str, *, key: str,
               where: Callable[[engine_jobs.Job], bool] | None = None) -> engine_jobs.Job | None:
    """Pick one of the jobs of these kinds (a new launch stored in `<key>_job` is chosen) and show its live panel;
    `where` keeps only the jobs about what the page shows (not another checkpoint's failed conversion)."""
    jobs = [j for j in all_jobs(kinds) if where is None or where(j)]
    if not jobs:
        return None
    picked = job_selector(title, jobs, key=f"{key}_watch", prefer_key=f"{key}_job")
    job_panel(picked.id, key=f"{key}_panel")
    return picked
