"""`make test` (what CI runs, `.ci/run`) runs what the README says: ruff, then everything but the `slow` tests, which
`make test-all` adds."""

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


def _make_lines(target: str) -> list[str]:
    make = subprocess.run(["make", "-n", "-W", ".venv/.installed", "-W", ".venv/.test-installed", target],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    return make.stdout.splitlines()


def _make_expression(target: str, addopts: list[str]) -> str:
    line = next(x for x in _make_lines(target) if " -m pytest" in x)
    argv = shlex.split(line)
    return _last_mark_expression(addopts + argv[argv.index("pytest") + 1:])  # the last -m wins


def test_make_test_runs_all_but_slow_and_make_test_all_adds_them():
    addopts = shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
                          ["addopts"])
    plain = _last_mark_expression(addopts)
    assert plain is not None and not _selects(plain, {"slow"})  # a plain `pytest` is the quick suite
    quick, everything = _make_expression("test", addopts), _make_expression("test-all", addopts)
    for marks in (set(), {"browser"}, {"vllm"}, {"speculators"}, {"llamacpp"}):
        assert _selects(quick, marks) and _selects(everything, marks), (quick, everything, marks)
    for marks in ({"slow"}, {"slow", "vllm"}):
        assert not _selects(quick, marks) and _selects(everything, marks), (quick, everything, marks)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    for target in ("test", "test-all"):  # a lint error fails CI before the tests run
        lines = _make_lines(target)
        ruff = [i for i, x in enumerate(lines) if x.split()[:3] == [".venv/bin/ruff", "check", "."]]
        pytest_at = next(i for i, x in enumerate(lines) if " -m pytest" in x)
        assert ruff and ruff[0] < pytest_at, (target, lines)
    assert "ruff==" in (ROOT / "requirements-test.txt").read_text()  # the test install brings the linter
    readme = (ROOT / "README.md").read_text()
    assert "lints with ruff, then runs every test except the" in readme and "`make test-all` runs" in readme
