"""Three layers, one direction: pages -> ui -> engine; engine never imports streamlit, pages never torch."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_engine_never_imports_streamlit_or_ui():
    for f in (ROOT / "engine").rglob("*.py"):
        bad = imports_of(f) & {"streamlit", "ui", "pages"}
        assert not bad, f"{f.relative_to(ROOT)} imports {bad}"


def test_ui_never_imports_pages():
    for f in (ROOT / "ui").rglob("*.py"):
        assert "pages" not in imports_of(f), f


def test_pages_hold_no_model_code():
    for f in list((ROOT / "pages").rglob("*.py")) + [ROOT / "app.py"]:
        if f.exists():
            bad = imports_of(f) & {"torch", "transformers", "safetensors"}
            assert not bad, f"{f.relative_to(ROOT)} imports {bad}"


def test_nothing_outside_the_algorithms_imports_one_of_them():
    """Algorithms are reached through `engine.algos.ALGOS` only (their folders can change freely); the registry's
    own modules (base, loading, shipped: the drafts that ship) and what every algorithm shares (common: layers,
    batching) are not algorithms."""
    code = [*(p for d in ("engine", "ui", "pages", "benchmarks") for p in (ROOT / d).rglob("*.py")), ROOT / "app.py"]
    for path in code:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("engine/algos/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                parts = name.split(".")
                assert not (parts[:2] == ["engine", "algos"] and len(parts) > 2
                            and parts[2] not in ("base", "loading", "shipped", "common")), f"{rel} imports {name}"


def test_no_test_module_imports_another():
    """Shared test helpers live in tests/testkit/ (and fixtures in conftest.py): no test_*.py imports a test_ module."""
    import ast
    from pathlib import Path

    offenders = []
    for path in sorted(Path(__file__).parent.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert not offenders, offenders
