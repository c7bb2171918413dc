"""Tests that only say which xdist worker ran them (tests/test_suite_groups.py runs this file under two workers)."""

import os
from pathlib import Path

import pytest

OUT = Path(os.environ.get("GROUP_PROBE_OUT", "."))


@pytest.mark.llamacpp
@pytest.mark.parametrize("name", ["a", "b", "c", "d"])
def test_served(name):
    (OUT / f"served-{name}").write_text(os.environ.get("PYTEST_XDIST_WORKER", ""))


@pytest.mark.parametrize("name", ["e", "f", "g", "h"])
def test_plain(name):
    (OUT / f"plain-{name}").write_text(os.environ.get("PYTEST_XDIST_WORKER", ""))
