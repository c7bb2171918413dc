"""`make test`'s two xdist workers keep a group together: the serial groups (servers, browser) on one worker each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_serial_group_runs_on_one_worker(tmp_path):
    """The four tests marked llamacpp (group "servers") share one worker under `--dist loadgroup`, as the Makefile
    runs the suite; before the grouping was mended for pytest 9 they were spread over both."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "-m", "not slow", str(ROOT / "tests" / "testkit" / "group_probe.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "GROUP_PROBE_OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    served = {p.read_text() for p in tmp_path.glob("served-*")}
    assert len(list(tmp_path.glob("served-*"))) == 4 and len(served) == 1, served
    assert len(list(tmp_path.glob("plain-*"))) == 4  # the file's other tests ran too
