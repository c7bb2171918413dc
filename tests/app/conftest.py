"""Fixtures of the app's tests: a private runs folder, the tiny random target, its EAGLE-3 draft and a dataset."""

from __future__ import annotations

import json

import pytest
import torch

from engine import jobs
from engine.algos.eagle3.args import Eagle3Args


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A private runs/ folder; jobs still running afterwards are stopped."""
    root = tmp_path / "runs"
    monkeypatch.setenv("WORKBENCH_RUNS", str(root))
    yield root
    for job in jobs.list_jobs(root):
        if job.running and jobs.stop(job):
            jobs.wait(job, timeout=30)


@pytest.fixture(scope="module")
def tiny_target(tiny_targets) -> str:
    return str(tiny_targets["llama"])


@pytest.fixture(scope="module")
def tiny_draft(tiny_target, tmp_path_factory) -> str:
    from engine.algos.eagle3.io import build_eagle3, save_eagle3
    from engine.targets.loading import load_target

    target = load_target(tiny_target)
    counts = torch.arange(target.vocab_size).flip(0)
    draft = build_eagle3(target, Eagle3Args(draft_vocab_size=160), token_counts=counts, aux_layer_ids=[1, 2, 3])
    return str(save_eagle3(draft, tmp_path_factory.mktemp("app-drafts") / "tiny-eagle3"))


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> str:
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."},
                          {"role": "assistant", "content": " ".join(str(j) for j in range(1, i + 2))}]}
            for i in range(3, 19)]
    path = tmp_path_factory.mktemp("app-data") / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
