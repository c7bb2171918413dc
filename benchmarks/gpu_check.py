"""What the CPU test suite cannot exercise, in one short run on a GPU machine: one line per check."""

#     PASS|SKIP|FAIL  <check>  <seconds>  <detail>
#
# Checks (each on a tiny random Llama target this script writes itself, tests/tiny.py):
#   cuda-extract-transformers  hidden-state extraction on CUDA with the transformers backend (bf16 target)
#   cuda-train-bf16            3 training steps on CUDA with bf16 autocast; loss finite, weights moved,
#                              the final draft validates
#   vllm-extract               extraction with the vLLM backend (only when vllm is importable), in a subprocess
#   nccl-ddp-2gpu              2 processes x 2 steps over NCCL, strategy ddp (only with >= 2 visible GPUs)
#   nccl-fsdp-2gpu             the same with strategy fsdp (FSDP2 bf16 mixed precision, DCP checkpoint)
#   vllm-serve-dflash2         a DFlash2 draft trained on CUDA for the built-in target, served by real vLLM (its V2
#                              runner; the CPU build refuses DFlash2) in fp32: greedy output identical to vLLM
#                              alone, accepted tokens per draft within 3% of our engine's (only with a CUDA
#                              vLLM environment, .venv-vllm of flavor cuda)
#   vllm-serve-gemma4-dspark   a DSpark draft in vLLM's Gemma4DSparkModel layout, trained on CUDA beside a tiny random
#                              Gemma 4 target, served by real vLLM in its own form (`serve` writes it; the CPU build
#                              refuses DSpark) in fp32: identical output, accepted tokens within 3% of ours (CUDA vLLM)
#
# Without CUDA every check prints SKIP with the reason and the script exits 0; any FAIL makes it exit 1.
# It is meant to take a few minutes on one GPU (most of it process start-up and, for vLLM, engine start-up).
#
#     python benchmarks/gpu_check.py [--work DIR] [--keep]
#
# Status: written and run on CPU only (all SKIP); not yet run on a GPU.

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from engine.data.options import ExtractOptions

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


class Skip(Exception):
    pass


RESULTS: list[tuple[str, str, float, str]] = []


def check(name: str, fn, *args) -> object:
    t0 = time.perf_counter()
    try:
        detail = fn(*args)
        status, value = "PASS", detail
    except Skip as exc:
        status, detail, value = "SKIP", str(exc), None
    except Exception as exc:  # noqa: BLE001 - a check's failure is its result
        status, detail, value = "FAIL", f"{type(exc).__name__}: {exc}".splitlines()[0][:300], None
        if os.environ.get("GPU_CHECK_DEBUG"):
            traceback.print_exc()
    seconds = time.perf_counter() - t0
    shown = detail if isinstance(detail, str) else (detail or {}).get("detail", "") if isinstance(detail, dict) else ""
    RESULTS.append((status, name, seconds, shown))
    print(f"{status:4}  {name:26} {seconds:7.1f}s  {shown}", flush=True)
    return value


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def run(cmd: list[str], timeout: int) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {proc.returncode}: {' | '.join(tail)}")
    return proc.stdout


def need_cuda(min_gpus: int = 1) -> int:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no CUDA device visible (torch.cuda.is_available() is False)")
    n = torch.cuda.device_count()
    if n < min_gpus:
        raise Skip(f"{n} GPU(s) visible, this check needs {min_gpus}")
    return n


# -- checks ----------------------------------------------------------------------------------------


def make_target(work: Path) -> Path:
    need_cuda()
    from tiny import save_tiny_target

    path = save_tiny_target(work / "target", "llama")
    return {"target": path, "detail": str(path)}


def extract_transformers(target: Path | None, work: Path) -> dict:
    need_cuda()
    if target is None:
        raise RuntimeError("no target")
    from engine.data.extract.dataset import extract_dataset

    out = work / "hs-cuda"
    manifest = extract_dataset(ExtractOptions(target=str(target), dataset="sharegpt", out=out, algo="eagle3",
                                              max_samples=16, max_length=160, dtype="bf16", device="cuda"),
                               progress=False)
    if manifest.get("samples") != 16:
        raise RuntimeError(f"{manifest.get('samples')} samples written, expected 16")
    from engine.data.store.files import HiddenStatesDataset

    sample = HiddenStatesDataset(out)[0]
    import torch

    if sample["hidden_states"].dtype != torch.bfloat16 or not torch.isfinite(sample["hidden_states"].float()).all():
        raise RuntimeError("hidden states are not finite bf16")
    return {"data": out, "detail": f"16 samples, {manifest.get('tokens')} tokens, layers {manifest.get('layer_ids')}"}


def train_bf16(target: Path | None, data: Path | None, work: Path) -> str:
    need_cuda()
    if target is None or data is None:
        raise RuntimeError("needs the target and the CUDA extraction")
    import torch

    from engine.format.validate import validate_draft
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer

    cfg = TrainConfig(target=str(target), data=str(data), out=str(work / "train-bf16"), device="cuda",
                      precision="bf16", max_steps=3, tokens_per_batch=256, max_length=160, draft_vocab_size=128,
                      warmup_steps=1, val_fraction=0.2, checkpoint_every=3)
    trainer = Trainer(cfg)
    before = {k: v.detach().clone() for k, v in trainer.draft.named_parameters() if v.requires_grad}
    seen = []
    hook = trainer.draft.fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    torch.cuda.reset_peak_memory_stats()
    final = trainer.run()
    hook.remove()
    rows = [json.loads(x) for x in (work / "train-bf16" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    if len(losses) != 3 or not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"train losses {losses}")
    if torch.bfloat16 not in seen:
        raise RuntimeError(f"the draft's fc ran in {set(seen)}, not bf16 (autocast inactive)")
    moved = max((p.detach() - before[k]).abs().max().item() for k, p in trainer.draft.named_parameters()
                if k in before)
    if not moved > 0:
        raise RuntimeError("weights did not change")
    report = validate_draft(final)
    if not report.ok:
        raise RuntimeError(f"final draft invalid: {report.errors[:2]}")
    tok_s = rows[-2]["tokens_per_s"] if len(rows) > 1 else 0
    return (f"losses {[round(x, 3) for x in losses]}, max weight change {moved:.2e}, "
            f"peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB, ~{tok_s:.0f} tok/s")


def extract_vllm(target: Path | None, work: Path) -> str:
    from engine.data.extract.vllm import vllm_unavailable_reason

    reason = vllm_unavailable_reason()
    if reason:
        raise Skip(f"vllm backend unavailable: {reason}")
    need_cuda()
    if target is None:
        raise RuntimeError("no target")
    out = work / "hs-vllm"
    run([sys.executable, "-m", "engine", "extract", "--target", str(target), "--dataset", "sharegpt", "--algo",
         "eagle3", "--max-samples", "8", "--max-length", "160", "--backend", "vllm", "--out", str(out)], timeout=600)
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.get("samples") != 8:
        raise RuntimeError(f"{manifest.get('samples')} samples, expected 8")
    return f"8 samples, {manifest.get('tokens')} tokens"


def nccl_two_gpus(strategy: str, target: Path | None, data: Path | None, work: Path) -> str:
    need_cuda(2)
    if target is None or data is None:
        raise RuntimeError("needs the target and the CUDA extraction")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / f"nccl-{strategy}"
    run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
         "-m", "engine", "train", "--target", str(target), "--data", str(data), "--out", str(out), "--device", "cuda",
         "--strategy", strategy, "--max-steps", "2", "--checkpoint-every", "2", "--tokens-per-batch", "256",
         "--max-length", "160", "--draft-vocab-size", "128", "--warmup-steps", "1", "--val-fraction", "0.2"],
        timeout=600)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    if len(losses) != 2 or not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"train losses {losses}")
    if strategy == "ddp" and not json.loads((out / "ddp_check.json").read_text())["ranks_agree"]:
        raise RuntimeError("DDP ranks disagree")
    if strategy == "fsdp" and not (out / "checkpoints" / "step_0000002" / "dcp" / ".metadata").is_file():
        raise RuntimeError("no DCP checkpoint")
    return f"losses {[round(x, 3) for x in losses]}"


DFLASH2_PROMPTS = [
    {"prompt": "The capital of France is"},
    {"prompt": "def fibonacci(n):"},
    {"messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]},
    {"messages": [{"role": "user", "content": "List three colours of the rainbow."}]},
]


def serve_dflash2(work: Path) -> str:
    """Train a small DFlash2 draft for the built-in target on CUDA, then serve it in real vLLM beside the target
    alone: lossless (fp32) and accepting what our engine accepts on the same prompts."""
    _cuda_vllm()
    import torch

    from engine.measure.bench import run_bench
    from engine.measure.options import BenchOptions
    from engine.measure.vllm_bench import run_vllm_bench
    from engine.targets.loading import load_target
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer
    from testkit.vllm import assert_accepts_as_ours

    k, tokens = 3, 48
    cfg = TrainConfig(algo="dflash2", target="smollm2-135m-instruct", online_dataset="sharegpt",
                      online_max_samples=256, out=str(work / "dflash2"), device="cuda", max_steps=300,
                      tokens_per_batch=2048, max_length=512, warmup_steps=10, lr=3e-3, val_fraction=0.05,
                      checkpoint_every=300, algo_args={"num_layers": 1, "block_size": k + 1, "selector_rank": 64,
                                                       "max_anchors": 256})
    draft = Trainer(cfg).run()
    options = BenchOptions(draft=str(draft), methods="baseline,draft", k=k, max_new_tokens=tokens, dtype="float32")
    served = run_vllm_bench(DFLASH2_PROMPTS, options, tokenize=True)["methods"]["draft"]
    if not served["identical_to_baseline"]:
        raise RuntimeError(f"vLLM's DFlash2 output differs from vLLM alone: {served['first_divergence']}")
    if not served["num_drafts"]:
        raise RuntimeError("vLLM made no DFlash2 drafts")
    target = load_target("smollm2-135m-instruct", device="cuda", dtype=torch.float32)
    ours = run_bench(target, DFLASH2_PROMPTS, BenchOptions(methods=("draft",), draft=str(draft), k=k,
                                                           max_new_tokens=tokens),
                     measure_cost=False, progress=False)
    assert_accepts_as_ours(served, ours["methods"]["draft"], "DFlash2 draft in vLLM")
    return (f"identical; vLLM {served['num_accepted_tokens']} accepted in {served['num_drafts']} drafts, ours "
            f"{ours['methods']['draft']['num_accepted_tokens']} in {ours['methods']['draft']['num_drafts']}")


def _cuda_vllm() -> None:
    """Refuse (Skip) without CUDA or a CUDA vLLM environment; else make the workbench's vLLM calls use it."""
    need_cuda()
    from engine.serve.venv import read_stamp

    venv = read_stamp()
    if venv is None or venv.flavor != "cuda":
        raise Skip("no CUDA vLLM environment: create it once with WORKBENCH_VLLM_FLAVOR=cuda (engine.serve.venv."
                   "ensure_vllm_env, needs the network), then run again")
    os.environ["WORKBENCH_VLLM_FLAVOR"] = "cuda"


def serve_gemma4_dspark(work: Path) -> str:
    """Train a DSpark draft in the Gemma 4 layout beside a tiny random Gemma 4 target (128 wide, head size 32) on
    CUDA, then serve it in real vLLM (Gemma4DSparkForCausalLM, through the folder `serve` writes) beside the target
    alone: lossless (fp32) and accepting what our engine accepts on the same prompts."""
    _cuda_vllm()
    import torch

    from engine.measure.bench import run_bench
    from engine.measure.options import BenchOptions
    from engine.measure.vllm_bench import run_vllm_bench
    from engine.targets.loading import load_target
    from engine.train.config import TrainConfig
    from engine.train.trainer import Trainer
    from testkit.vllm import assert_accepts_as_ours
    from tiny import save_tiny_target

    k, tokens = 3, 32
    target = save_tiny_target(work / "gemma4-target", "gemma4_text", hidden_size=128)
    cfg = TrainConfig(algo="dspark", target=str(target), online_dataset="sharegpt", online_max_samples=256,
                      out=str(work / "gemma4-dspark"), device="cuda", max_steps=300, tokens_per_batch=2048,
                      max_length=256, warmup_steps=10, lr=3e-3, val_fraction=0.05, checkpoint_every=300,
                      aux_layer_ids=[2, 3],  # with the last layer as the training target: a random target is
                      algo_args={"num_layers": 1, "block_size": k + 1, "markov_rank": 32,  # unpredictable from one
                                 "draft_layout": "gemma4", "calibration_blocks": 0})  # middle layer alone
    draft = Trainer(cfg).run()
    options = BenchOptions(draft=str(draft), methods="baseline,draft", k=k, max_new_tokens=tokens, dtype="float32")
    served = run_vllm_bench(DFLASH2_PROMPTS, options, tokenize=True)["methods"]["draft"]
    if not served["identical_to_baseline"]:
        raise RuntimeError(f"vLLM's Gemma 4 DSpark output differs from vLLM alone: {served['first_divergence']}")
    ours = run_bench(load_target(str(target), device="cuda", dtype=torch.float32), DFLASH2_PROMPTS,
                     BenchOptions(methods=("draft",), draft=str(draft), k=k, max_new_tokens=tokens),
                     measure_cost=False, progress=False)["methods"]["draft"]
    assert_accepts_as_ours(served, ours, "Gemma 4 DSpark draft in vLLM")
    return (f"identical; vLLM {served['num_accepted_tokens']} accepted in {served['num_drafts']} drafts, ours "
            f"{ours['num_accepted_tokens']} in {ours['num_drafts']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", help="scratch folder (default: a temp folder, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = p.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) or "none"
    print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda or '-'}, {gpus} GPU(s): {names}",
          flush=True)
    t0 = time.perf_counter()
    made = check("tiny-target", make_target, work)
    target = made["target"] if isinstance(made, dict) else None
    extracted = check("cuda-extract-transformers", extract_transformers, target, work)
    data = extracted["data"] if isinstance(extracted, dict) else None
    check("cuda-train-bf16", train_bf16, target, data, work)
    check("vllm-extract", extract_vllm, target, work)
    check("nccl-ddp-2gpu", nccl_two_gpus, "ddp", target, data, work)
    check("nccl-fsdp-2gpu", nccl_two_gpus, "fsdp", target, data, work)
    check("vllm-serve-dflash2", serve_dflash2, work)
    check("vllm-serve-gemma4-dspark", serve_gemma4_dspark, work)
    counts = {s: sum(1 for r in RESULTS if r[0] == s) for s in ("PASS", "SKIP", "FAIL")}
    print(f"gpu_check: {counts['PASS']} pass, {counts['SKIP']} skip, {counts['FAIL']} fail in "
          f"{time.perf_counter() - t0:.0f}s", flush=True)
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
