"""Jobs: launched as process groups, report status.json themselves, survive a reload, stop on SIGTERM, lock dirs."""

from __future__ import annotations

import pytest

from engine import jobs
from engine.errors import WorkbenchError


def test_job_runs_reports_and_is_listed(tmp_path):
    job = jobs.launch(["targets", "--prepare", "none", "--json"], root=tmp_path)
    done = jobs.wait(job, timeout=60)
    assert done.status.state == "done", done.log_tail()
    assert "smollm2-135m-instruct" in (job.dir / "stdout.log").read_text()  # the whole output (the tail may be
    # only the kernel choice's timings, where this machine has measured them)
    listed = jobs.list_jobs(tmp_path)
    assert [j.id for j in listed] == [job.id] and listed[0].command.startswith("python -m engine targets")
    assert (job.dir / "command.txt").read_text().startswith("python -m engine targets")


def test_failed_command_is_reported_failed(tmp_path):
    job = jobs.launch(["validate", str(tmp_path / "missing")], root=tmp_path)
    done = jobs.wait(job, timeout=60)
    assert done.status.state == "failed"


def test_dir_lock_excludes_a_second_writer(tmp_path):
    with jobs.DirLock(tmp_path / "out", "first"):
        with pytest.raises(WorkbenchError, match="in use by another job"):
            with jobs.DirLock(tmp_path / "out", "second"):
                pass
    with jobs.DirLock(tmp_path / "out", "third"):
        pass


def test_atomic_writes_get_the_usual_modes(tmp_path):
    """Temp files are private; the finished file and folder must not be (a draft folder is shared and served)."""
    import stat

    from engine.fsutil import DIR_MODE, FILE_MODE, atomic_directory, atomic_write_text

    path = atomic_write_text(tmp_path / "a.json", "{}")
    assert stat.S_IMODE(path.stat().st_mode) == FILE_MODE and FILE_MODE & 0o044  # group/others can read
    with atomic_directory(tmp_path / "draft") as folder:
        (folder / "config.json").write_text("{}")
    assert stat.S_IMODE((tmp_path / "draft").stat().st_mode) == DIR_MODE and DIR_MODE & 0o055
