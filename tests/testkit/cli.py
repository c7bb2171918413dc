"""The CLI run in the test's own process (`engine.cli.main`), its output read through pytest's capsys."""

from __future__ import annotations


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`python -m engine ARGV` in-process -> (exit code, stdout, stderr) of that call alone."""
    from engine.cli import main

    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def cli_ok(capsys, *argv: str) -> str:
    """As `run_cli`, asserting exit code 0 (stderr's tail in the message) -> stdout."""
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err[-2000:]
    return out
