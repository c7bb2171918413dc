"""`make test` (what CI runs, `.ci/run`) runs the whole suite, as the README says: the `slow` tests too."""

from __future__ import annotations

import shlex
import subprocess
import tomllib
from pathlib import Path

from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[1]


def _selects(expression: str, marks: set[str]) -> bool:
    return Expression.compile(expression).evaluate(lambda name, **kw: name in marks)


def _last_mark_expression(argv: list[str]) -> str | None:
    found = None
    for i, arg in enumerate(argv):
        if arg == "-m":
            found = argv[i + 1]
    return found


def test_make_test_selects_the_slow_tests_that_a_plain_pytest_leaves_out():
    addopts = shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
                          ["addopts"])
    plain = _last_mark_expression(addopts)
    assert plain is not None and not _selects(plain, {"slow"})  # a plain `pytest` is the quick suite
    make = subprocess.run(["make", "-n", "-W", ".venv/.installed", "-W", ".venv/.test-installed", "test"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    line = next(x for x in make.stdout.splitlines() if " -m pytest" in x)
    argv = shlex.split(line)
    expression = _last_mark_expression(addopts + argv[argv.index("pytest") + 1:])  # the last -m wins
    for marks in ({"slow"}, set(), {"browser"}, {"vllm"}, {"speculators"}, {"slow", "vllm"}):
        assert _selects(expression, marks), (expression, marks)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "runs the whole test suite" in (ROOT / "README.md").read_text()
