"""Fault tests with real processes: `python -m engine` SIGKILLed in the middle of a write (extraction, regeneration,
training), then rerun; and a disk that fills up during extraction. Whatever was finished is kept, nothing corrupt
is left, and the rerun ends with what an uninterrupted run gives."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
DIE = ROOT / "tests" / "engine" / "_die_mid_write.py"


def engine(args: list[str], *, die_on: str | None = None, flag: Path | None = None) -> subprocess.Popen:
    """`python -m engine ARGS` (or the dying wrapper) in a process group of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "engine", *args]
    if die_on:
        env.update(DIE_ON=die_on, DIE_FLAG=str(flag))
        cmd = [sys.executable, str(DIE), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def in_process(args: list[str]) -> None:
    """`python -m engine ARGS` in this process, on one thread as the subprocesses run (same float reductions)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli_main(args) == 0
    finally:
        torch.set_num_threads(threads)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def kill_mid_write(args: list[str], die_on: str, tmp_path: Path) -> str:
    """Run until the wrapper is stuck half-way through the chosen write, then SIGKILL the whole group."""
    flag = tmp_path / f"dying-{die_on.replace(':', '_')}"
    proc = engine(args, die_on=die_on, flag=flag)
    deadline = time.time() + 300
    while not flag.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before the chosen write (rc {proc.returncode}):\n{proc.stdout.read()[-4000:]}")
        assert time.time() < deadline, "the chosen write never came"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return out


def samples(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {p.name: load_file(str(p)) for p in sorted(folder.glob("hs_*.safetensors"))}


def same_samples(a: Path, b: Path) -> None:
    sa, sb = samples(a), samples(b)
    assert sorted(sa) == sorted(sb)
    for name in sa:
        for key in sa[name]:
            assert torch.equal(sa[name][key], sb[name][key]), (name, key)


@pytest.fixture(scope="module")
def extract_args(tiny_targets):
    return ["extract", "--target", str(tiny_targets["llama"]), "--dataset", "sharegpt", "--max-samples", "10",
            "--max-length", "64", "--dtype", "fp32", "--batch-size", "2", "--algo", "eagle3"]


@pytest.fixture(scope="module")
def extracted(extract_args, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "full"
    in_process([*extract_args, "--out", str(out)])
    return out


def test_extraction_killed_mid_write_resumes_to_the_uninterrupted_result(extract_args, extracted, tmp_path):
    out = tmp_path / "hs"
    kill_mid_write([*extract_args, "--out", str(out)], "safetensors:5:hs_", tmp_path)
    done = {p.name: p.stat().st_mtime_ns for p in out.glob("hs_*.safetensors")}
    assert len(done) == 4  # the fifth sample was half-written into its temp file
    assert [p.name for p in out.glob(".hs_*.tmp")], "expected the half-written temp file a kill leaves"
    for p in out.glob("hs_*.safetensors"):
        load_file(str(p))  # every finished sample is whole
    log = finish(engine([*extract_args, "--out", str(out)]))
    assert "resum" in log.lower(), log[-2000:]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("hs_*.safetensors") if p.name in done} == done
    assert not list(out.glob(".*.tmp"))
    same_samples(out, extracted)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["samples"] == 10
    assert torch.equal(load_file(str(out / "token_freq.safetensors"))["counts"],
                       load_file(str(extracted / "token_freq.safetensors"))["counts"])


def test_a_full_disk_during_extraction_keeps_what_was_written_and_resumes(extract_args, extracted, tmp_path,
                                                                         monkeypatch, capsys):
    import safetensors.torch

    out = tmp_path / "hs"
    real, calls = safetensors.torch.save_file, []  # calls: True for each sample file

    def full_disk(tensors, filename, metadata=None):
        calls.append("hs_" in str(filename))
        if sum(calls) >= 4:
            Path(filename).write_bytes(b"\0" * 100)  # some bytes made it before the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device", str(filename))
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    assert cli_main([*extract_args, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "no space left on the disk" in err and "Traceback" not in err
    assert len(list(out.glob("hs_*.safetensors"))) == 3 and not list(out.glob(".*.tmp"))
    same_samples_so_far = samples(out)
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert cli_main([*extract_args, "--out", str(out)]) == 0
    for name, tensors in same_samples_so_far.items():
        assert all(torch.equal(tensors[k], load_file(str(out / name))[k]) for k in tensors)
    same_samples(out, extracted)


@pytest.fixture(scope="module")
def regenerate_args(tiny_targets):
    return ["regenerate", "--target", str(tiny_targets["llama"]), "--dataset", "sharegpt", "--max-samples", "8",
            "--max-new-tokens", "6", "--max-length", "96", "--temperature", "0", "--backend", "transformers",
            "--batch-size", "1"]  # greedy on the fused batch: FUSED_GROUP conversations per append


def answers(path: Path) -> dict[str, list]:
    """id -> messages of every row (the timing metadata differs between runs)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["id"]: r["messages"] for r in rows}


def test_regeneration_killed_mid_write_resumes_to_the_uninterrupted_result(regenerate_args, tmp_path):
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    in_process([*regenerate_args, "--out", str(full)])  # the uninterrupted reference
    kill_mid_write([*regenerate_args, "--out", str(part)], "rows:2", tmp_path)
    data = part.read_bytes()
    assert not data.endswith(b"\n"), "expected the half-written row a kill leaves"
    kept = data[: data.rindex(b"\n") + 1]
    assert 1 <= len(kept.splitlines()) < len(answers(full))  # the append before the second
    log = finish(engine([*regenerate_args, "--out", str(part)]))
    assert "partial line" in log
    assert part.read_bytes().startswith(kept)  # finished rows untouched
    assert answers(part) == answers(full) and len(answers(full)) > len(kept.splitlines())
    assert len(part.read_text().splitlines()) == len(answers(full))  # nothing twice


@pytest.fixture(scope="module")
def train_args(tiny_targets, extracted):
    return ["train", "--target", str(tiny_targets["llama"]), "--data", str(extracted), "--tokens-per-batch", "128",
            "--max-length", "64", "--draft-vocab-size", "64", "--warmup-steps", "1", "--lr", "3e-3",
            "--val-every", "1000", "--checkpoint-every", "2", "--val-fraction", "0.2", "--seed", "0",
            "--max-steps", "4", "--device", "cpu"]


def test_training_killed_mid_checkpoint_resumes_bit_identically(train_args, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    in_process([*train_args, "--out", str(full)])  # the uninterrupted reference
    kill_mid_write([*train_args, "--out", str(part)], "safetensors:1:step_0000004", tmp_path)
    ckpts = part / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_0000002"
    assert not (ckpts / "step_0000004").exists()
    assert [p.name for p in ckpts.iterdir() if p.name.startswith(".step_0000004")], "expected the killed temp folder"
    log = finish(engine([*train_args, "--out", str(part)]))
    assert "resumed from" in log
    assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".")]
    a, b = load_file(str(full / "draft" / "model.safetensors")), load_file(str(part / "draft" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    steps = [json.loads(line)["step"] for line in (part / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == [1, 2, 3, 4]
