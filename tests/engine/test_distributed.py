"""Training over several processes on CPU (gloo): DDP, FSDP2 and one process agree; a killed FSDP2 run resumes
exactly; two "nodes" on localhost meet through torchrun's c10d rendezvous."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.data.options import ExtractOptions
from engine.format.validate import validate_draft
from engine.train.config import TrainConfig
from engine.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
# 2 EAGLE-3 layers (two FSDP units plus the root), uneven validation batches over 2 ranks, checkpoints.
COMMON = dict(tokens_per_batch=256, max_length=160, draft_vocab_size=128, warmup_steps=1, lr=3e-3,
              val_fraction=0.2, val_every=3, val_max_batches=3, max_steps=6, epochs=3, checkpoint_every=2,
              keep_checkpoints=5, num_layers=2, seed=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flags(values: dict) -> list[str]:
    out = []
    for k, v in values.items():
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


def env(**extra) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def torchrun(launch: list[str], train: dict, *, script: list[str] | None = None, extra_env=None, **popen):
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, *(script or ["-m", "engine"]), "train",
           *flags(train)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env(**(extra_env or {})), start_new_session=True, **popen)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def two_procs() -> list[str]:
    return ["--nproc-per-node", "2", "--master-port", str(free_port())]


def weights(out: Path, step: int = 6) -> dict[str, torch.Tensor]:
    """The fp32 weights of a run's checkpoint at `step` (the final draft/ folder is bf16)."""
    return load_file(str(out / "checkpoints" / f"step_{step:07d}" / "model.safetensors"))


def assert_close(a: dict, b: dict, exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5, msg=k)


@pytest.fixture(scope="module")
def dist_data(tiny_targets, tmp_path_factory) -> Path:
    from engine.data.extract.dataset import extract_dataset

    out = tmp_path_factory.mktemp("hs") / "llama"
    extract_dataset(ExtractOptions(target=str(tiny_targets["llama"]), dataset="sharegpt", out=out, algo="eagle3",
                                   max_samples=24, max_length=160, dtype="fp32"), progress=False)
    return out


@pytest.fixture(scope="module")
def runs(tiny_targets, dist_data, tmp_path_factory) -> dict[str, Path]:
    """The same training as one process (2 micro-batches a step), DDP and FSDP2 (2 processes, 1 each)."""
    root = tmp_path_factory.mktemp("runs")
    base = dict(target=str(tiny_targets["llama"]), data=str(dist_data), **COMMON)
    started = time.perf_counter()
    ddp = torchrun(two_procs(), {**base, "out": root / "ddp", "strategy": "ddp"})
    one = Trainer(TrainConfig(**base, out=str(root / "one"), grad_accum=2))  # same global batch
    assert one.total_steps == 6
    one.run()
    finish(ddp)
    fsdp = finish(torchrun(two_procs(), {**base, "out": root / "fsdp", "strategy": "fsdp"}))
    assert "FSDP2 over 2 ranks: 2 sharded unit(s)" in fsdp
    print(f"one/ddp/fsdp runs: {time.perf_counter() - started:.1f}s")
    return {"one": root / "one", "ddp": root / "ddp", "fsdp": root / "fsdp", "base": base, "root": root}


def test_ddp_fsdp_and_one_process_reach_the_same_weights(runs):
    one, ddp, fsdp = (weights(runs[k]) for k in ("one", "ddp", "fsdp"))
    assert_close(ddp, one)
    assert_close(fsdp, one)
    assert_close(fsdp, ddp)
    # the frozen draft lm_head did not move; the trained layers did
    first = weights(runs["fsdp"], 2)
    assert torch.equal(first["lm_head.weight"], fsdp["lm_head.weight"])
    assert not torch.equal(first["layers.1.self_attn.q_proj.weight"], fsdp["layers.1.self_attn.q_proj.weight"])
    # the FSDP checkpoint: shards from both ranks, the consolidated draft, each rank's RNG
    ckpt = runs["fsdp"] / "checkpoints" / "step_0000006"
    assert (ckpt / "dcp" / ".metadata").is_file() and len(list((ckpt / "dcp").glob("*.distcp"))) == 2
    assert {p.name for p in (ckpt / "trainer_state" / "rng").iterdir()} == {"rank0.safetensors", "rank1.safetensors"}
    state = json.loads((ckpt / "trainer_state" / "state.json").read_text())
    assert state["strategy"] == "fsdp" and state["world"] == 2
    assert validate_draft(runs["fsdp"] / "draft").ok and validate_draft(ckpt).ok
    # metrics: the same losses (all-reduced), validation ran with 3 batches over 2 ranks
    rows = {k: [json.loads(x) for x in (runs[k] / "metrics.jsonl").read_text().splitlines()] for k in runs
            if k in ("one", "ddp", "fsdp")}
    val = {k: [r["loss"] for r in v if r["split"] == "val"] for k, v in rows.items()}
    assert len(val["fsdp"]) == 3  # steps 0, 3, 6
    for k in ("ddp", "fsdp"):
        assert val[k] == pytest.approx(val["one"], rel=1e-4)
    progress = sorted((runs["fsdp"] / "progress").glob("rank*.json"))
    assert [json.loads(p.read_text())["state"] for p in progress] == ["done", "done"]


def test_killed_fsdp_run_resumes_exactly(runs):
    out = runs["root"] / "fsdp_killed"
    train = {**runs["base"], "out": out, "strategy": "fsdp"}
    proc = torchrun(two_procs(), train, script=[str(ROOT / "tests" / "engine" / "_hang_after_checkpoint.py")],
                    extra_env={"HANG_AFTER_STEP": "2"})
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 240
    while not (latest.is_file() and latest.read_text().strip() == "step_0000002"):
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.time() < deadline, "no checkpoint at step 2"
        time.sleep(0.2)
    time.sleep(0.5)
    # torchrun starts each rank in a session of its own: kill the ranks (pids from their progress files) and
    # the agent, mid-step 3
    pids = [json.loads(p.read_text())["pid"] for p in (out / "progress").glob("rank*.json")]
    assert len(pids) == 2
    for pid in [*pids, proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (out / "checkpoints" / "step_0000004").exists()
    resumed = finish(torchrun(two_procs(), train))
    assert "resumed from" in resumed
    assert_close(weights(out), weights(runs["fsdp"]), exact=True)


def test_two_nodes_meet_through_c10d_rendezvous(runs):
    """Two torchrun agents ("nodes") on localhost, one process each, FSDP2 across them."""
    out = runs["root"] / "two_nodes"
    port = free_port()
    train = {**runs["base"], "out": out, "strategy": "fsdp"}
    nodes = [torchrun(["--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "wb-test"], train) for r in (0, 1)]
    for node in nodes:
        finish(node)
    assert_close(weights(out), weights(runs["fsdp"]))
    ranks = [json.loads(p.read_text()) for p in sorted((out / "progress").glob("rank*.json"))]
    assert [(r["rank"], r["world"], r["local_rank"], r["state"]) for r in ranks] == [(0, 2, 0, "done"),
                                                                                       (1, 2, 0, "done")]


def test_fsdp_trains_an_algorithm_without_layers(tiny_targets, dist_data, tmp_path):
    """The toy plugin (one linear head, no decoder layers): FSDP2 shards the draft as a single unit. One validation
    batch for two ranks: the rank without one still joins the reduction (this used to hang)."""
    base = dict(target=str(tiny_targets["llama"]), data=str(dist_data), algo="toy", tokens_per_batch=256,
                max_length=160, warmup_steps=1, lr=3e-3, val_fraction=0.2, max_steps=3, checkpoint_every=3,
                val_max_batches=1, val_every=2, seed=0)
    plugin = {"WORKBENCH_ALGO_PLUGINS": str(ROOT / "tests" / "toy_algo")}
    out = finish(torchrun(two_procs(), {**base, "out": tmp_path / "fsdp", "strategy": "fsdp"}, extra_env=plugin))
    assert "FSDP2 over 2 ranks: 0 sharded unit(s)" in out
    subprocess.run([sys.executable, "-m", "engine", "train", *flags({**base, "out": tmp_path / "one",
                                                                     "grad_accum": 2})],
                   check=True, cwd=ROOT, env=env(**plugin), capture_output=True)
    assert_close(weights(tmp_path / "fsdp", 3), weights(tmp_path / "one", 3))


def test_offline_data_streams_each_rank_reads_only_its_samples(dist_data, tmp_path, monkeypatch):
    """Opening a folder reads headers only (no hidden states, even without token_freq); each rank's batch plan is
    its own, disjoint from the other rank's, and the same every time (the resume cursor indexes into it)."""
    import shutil

    from engine.algos.common.batching import plan_packed_batches, split_indices
    from engine.data.store import files as store
    from engine.train.trainer import OfflineData

    folder = tmp_path / "hs"
    shutil.copytree(dist_data, folder)
    expected = store.HiddenStatesDataset(folder).token_freq()
    (folder / store.TOKEN_FREQ).unlink()
    loads = []
    real = store.load_sample
    monkeypatch.setattr(store, "load_sample", lambda path: loads.append(path) or real(path))
    data = OfflineData(str(folder))
    assert torch.equal(data.token_counts(), expected) and loads == []
    assert len(data.lengths) == len(data) and all(n > 0 for n in data.lengths)
    train, _ = split_indices(len(data), 0.2, 0)
    plan = plan_packed_batches(train, data.lengths, 256, 0, 0)
    per_rank = [plan[: len(plan) // 2 * 2][r::2] for r in (0, 1)]
    seen = [{i for b in p for i in b} for p in per_rank]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert plan_packed_batches(train, data.lengths, 256, 0, 0) == plan != plan_packed_batches(train, data.lengths,
                                                                                              256, 0, 1)
    data[per_rank[1][0][0]]
    assert len(loads) == 1
