"""Sentences of the README pinned (`bench --dtype` spellings, the Demo chat's cut marks), the README's shape, and
docstrings short enough to read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from engine.cli import build_parser
from engine.generate.events import StepEvent
from engine.targets.dtypes import DECODE_DTYPES, decode_dtype, vllm_dtype


@pytest.mark.parametrize("command", ["bench", "generate", "evaluate"])
@pytest.mark.parametrize("spelling,dtype", [("fp32", torch.float32), ("float32", torch.float32),
                                            ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16)])
def test_decoding_commands_take_both_dtype_spellings(command, spelling, dtype):
    extra = {"evaluate": ["--draft", "D"], "generate": ["hi"]}.get(command, [])
    args = build_parser().parse_args([command, *extra, "--dtype", spelling])
    assert args.dtype == spelling and decode_dtype(args.dtype) == dtype
    assert vllm_dtype(args.dtype) == {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]


def test_an_unknown_dtype_is_refused_by_the_parser_and_auto_serves_bf16_in_vllm():
    assert set(DECODE_DTYPES) == {"auto", "fastest", "bf16", "bfloat16", "fp32", "float32"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--dtype", "fp64"])
    assert vllm_dtype("auto") == "bfloat16" and vllm_dtype("fastest") == "bfloat16"
    assert build_parser().parse_args(["generate", "hi", "--dtype", "fastest"]).dtype == "fastest"


def test_the_demo_chat_marks_the_withheld_slots_and_the_cut_in_the_survival_estimates():
    from ui.chat import BLOCK_MARKS, block_marks, survival_text

    event = StepEvent(step=1, tokens=[5, 6], sources=["draft", "target"], drafted=2, accepted=1, withheld=2,
                      confidence=[0.93, 0.71, 0.14, 0.05])
    assert block_marks(event) == "✓✗✂✂" and BLOCK_MARKS["withheld"] == "✂"
    assert survival_text(event) == "0.93 0.71 | 0.14 0.05"


ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "RELIABILITY.md", *sorted((ROOT / "docs").glob("*.md"))]


def _links(text: str) -> list[str]:
    """Targets of the markdown links `[text](target)` in `text`, code spans left out."""
    return re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", text))


def test_the_readme_reads_in_five_minutes_and_every_doc_link_leads_somewhere():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) <= 2000, len(readme.split())
    for doc in DOCS:
        text = doc.read_text()
        cells = [c.strip() for line in text.splitlines() if line.lstrip().startswith("|")
                 for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        assert not [c for c in cells if len(c.split()) > 40], doc.name  # a table cell is one line
        assert cells or doc.name != "README.md"  # the README's tables were found
        assert not re.findall(r"\bissues? #?\d+", text, re.IGNORECASE), doc.name  # the reader has no issue tracker
        for link in _links(text):
            if re.match(r"[a-z]+:", link) or link.startswith("#"):  # a web address or an anchor on the same page
                continue
            assert (doc.parent / link.split("#")[0]).exists(), (doc.name, link)


def test_no_docstring_runs_over_80_words():
    """Detail belongs in comments or docs/: a docstring says what a module, class or function is for."""
    long = []
    for path in [ROOT / "app.py", *(p for d in ("engine", "ui", "pages", "tests", "benchmarks")
                                    for p in sorted((ROOT / d).rglob("*.py")))]:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                words = len((ast.get_docstring(node) or "").split())
                if words > 80:
                    long.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)} ({words} words)")
    assert not long, long


def test_the_number_of_slow_tests_the_readme_and_testing_doc_give_is_the_suites():
    """README and docs/testing.md say how many tests `make test` leaves out as slow: the collected count."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-p", "no:xdist",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600).stdout
    slow = int(re.search(r"(\d+)/\d+ tests collected", out).group(1))
    for doc in ("README.md", "docs/testing.md"):
        assert f"every test except the {slow} marked `slow`" in (ROOT / doc).read_text(), (doc, slow)
