"""Shared test fixtures: tiny random targets, the built-in target, reference fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from _pytest.nodeid import coerce_node_id  # the only way to name a test's xdist group in pytest 9

import engine.algos  # noqa: F401  (fills the registries, as the CLI and the app do at their entry)

ROOT = Path(__file__).resolve().parents[1]
# A copy of ../shared/fixtures/speculators-0.9.0 (configs and tensor listings speculators 0.9.0 emits).
FIXTURES = ROOT / "tests" / "fixtures" / "speculators-0.9.0"
# A draft algorithm in one folder outside engine/ (tests/engine/test_algorithms.py), loaded as a plugin.
TOY_ALGO = ROOT / "tests" / "toy_algo"

# Under pytest-xdist (`make test` runs two workers) the cores are shared out between the workers, and the processes
# a test starts (CLI runs, the app, torchrun ranks) get the same share: more threads than cores spin against the
# other worker (docs/testing.md: the suite before and after this on a 2-core Zen 4).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // WORKERS))
torch.set_num_threads(THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
# Tests that start servers, and the browser tests' app: one group on one worker, one after another (two vLLM servers
# at once on two cores would each take twice as long to start), and first, as they are the longest unit. vLLM's CPU
# build pins its OpenMP threads to the cores: llama-servers beside it crawled, and the browser tests' timed bars and
# servers failed beside it (benchmarks/results/test_suite/amd-epyc-zen5-2026-12-07-groups.json, 2 of 15).
SERIAL_GROUPS = {"vllm": "servers", "llamacpp": "servers", "browser": "servers"}  # marker -> group
GROUP_ORDER = ("servers",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """For `--dist loadgroup`: a file's tests stay on one worker (its module fixtures are built once), and the tests
    of each SERIAL_GROUPS group share one worker; the groups come first."""
    def group(item) -> str:
        return next((g for mark, g in SERIAL_GROUPS.items() if item.get_closest_marker(mark)),
                    item.nodeid.split("::")[0])

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
        if config.getoption("loadgroup", False) and "@" not in item.nodeid:  # on an xdist worker
            # xdist 3.8 tells its scheduler the group by renaming item._nodeid to "<id>@<group>", which pytest 9 no
            # longer reads (Node.nodeid is its _id): without this every group was spread over both workers, servers
            # and module fixtures ran twice at once (the llama.cpp tests took 250-310 s each instead of 8-16 s)
            item._id = coerce_node_id(f"{item.nodeid}@{group(item)}")
    items.sort(key=lambda item: GROUP_ORDER.index(group(item)) if group(item) in GROUP_ORDER else len(
        GROUP_ORDER))  # stable: files keep their order


@pytest.fixture(autouse=True)
def app_settings(tmp_path_factory, monkeypatch) -> Path:
    """The app's saved choices (ui.state) go to a file of each test's own; no target change accepted."""
    path = tmp_path_factory.mktemp("settings") / "app-settings.json"
    monkeypatch.setenv("WORKBENCH_SETTINGS", str(path))
    # `--accept-target-change` run in-process sets this for its process: undone after each test, so it never leaks on
    monkeypatch.setenv("WORKBENCH_ACCEPT_TARGET_CHANGE", "0")
    return path


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_targets(tmp_path_factory) -> dict[str, Path]:
    """Folders of tiny random Llama, Qwen3 and Qwen3-MoE targets (with a ChatML tokenizer)."""
    from tiny import ARCHS, save_tiny_target

    root = tmp_path_factory.mktemp("tiny-targets")
    return {arch: save_tiny_target(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_targets):
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["llama"]))


@pytest.fixture(scope="session")
def builtin_target():
    """The built-in SmolLM2-135M-Instruct target (dequantized once, cached under WORKBENCH_HOME)."""
    from engine.targets.loading import load_target

    return load_target("smollm2-135m-instruct")


@pytest.fixture
def toy_registered():
    """The toy algorithm registered in this process too (AppTest runs the app here); removed afterwards."""
    from engine.algos import ALGOS, load_plugins
    from engine.format.config import CONFIG_TYPES

    load_plugins(str(TOY_ALGO))
    yield ALGOS.get("toy")
    ALGOS.unregister("toy")
    CONFIG_TYPES.unregister("toy")
    for name in [m for m in sys.modules if m == "workbench_plugin_toy_algo" or
                 m.startswith("workbench_plugin_toy_algo.")]:
        sys.modules.pop(name)
