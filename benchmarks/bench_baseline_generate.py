"""The engine's plain greedy decoding (the baseline every speedup is measured against) vs transformers' own
`generate`, in each dtype, on the same held-out prompts, interleaved prompt by prompt."""

# Each side decodes the same chat-templated prompt greedily to the same number of new tokens (EOS ignored, so both
# produce exactly `--max-new-tokens`); tokens/s is new tokens over the whole call (prefill included), summed over the
# prompts. The engine runs on the kernel path `--dtype` forces (fp32, or bf16 routed through
# engine.generate.cpu_kernels) and, as `auto`, on the one measured on this CPU (engine.generate.kernel_choice);
# transformers runs an unrouted copy of the same weights. Whether the two produce the same tokens is recorded too.
#
#     .venv/bin/python benchmarks/bench_baseline_generate.py --json benchmarks/results/baseline_generate/builtin.json

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)


def _engine_side(target: str | None, dtype: str):
    from engine.generate.kernel_choice import choose, load_decode_target
    from engine.generate.runner import TargetRunner

    if dtype == "auto":
        choose(target, device="cpu", refresh=True)  # measured in this run (then read from the cache by the load)
    loaded = load_decode_target(target, dtype, device="cpu")
    return loaded, TargetRunner(loaded)


def _hf_side(target: str | None, dtype: str):
    from engine.targets.loading import load_target

    return load_target(target, dtype="bf16" if dtype == "bf16" else "fp32", device="cpu", with_tokenizer=False)


def _run_engine(runner, ids: list[int], new: int) -> tuple[list[int], float]:
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all

    params = SamplingParams(max_new_tokens=new, eos_token_ids=[])
    t = time.perf_counter()
    out = generate_all(runner, ids, params)[0]
    return out, time.perf_counter() - t


def _run_hf(model, ids: list[int], new: int) -> tuple[list[int], float]:
    import torch

    input_ids = torch.tensor([ids])
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist(), time.perf_counter() - t


def measure(target: str | None, *, dtypes: list[str], prompts: int, new: int) -> dict[str, Any]:
    import torch
    from tqdm import tqdm

    from engine.cpu import describe
    from engine.data.render.datasets import heldout_prompts
    from engine.generate.prompt import prompt_ids

    sides, kernels = {}, {}
    tokenizer = None
    for dtype in dtypes:
        loaded, runner = _engine_side(target, dtype)
        tokenizer = loaded.tokenizer
        kernels[dtype] = loaded.extra["kernel_summary"]
        path = loaded.extra["kernel"]["path"]
        sides[f"engine baseline ({dtype}: {path})"] = ("engine", runner)
        if dtype != "auto":
            sides[f"transformers generate ({dtype})"] = ("hf", _hf_side(target, dtype).model)
    rows = [prompt_ids(tokenizer, p) for p in heldout_prompts("sharegpt", n=prompts, max_chars=600)]
    for kind, obj in sides.values():  # warm-up: first calls allocate
        (_run_engine if kind == "engine" else _run_hf)(obj, rows[0][:16], 4)
    seconds = {name: 0.0 for name in sides}
    outputs: dict[str, list[list[int]]] = {name: [] for name in sides}
    for ids in tqdm(rows, desc="prompts"):
        for name, (kind, obj) in sides.items():  # interleaved: every side sees the same machine load
            out, s = (_run_engine if kind == "engine" else _run_hf)(obj, ids, new)
            seconds[name] += s
            outputs[name].append(out)
    total = new * len(rows)
    result = {"tokens_per_s": {n: total / s for n, s in seconds.items()}, "seconds": seconds}
    same = {}
    for dtype in dtypes:
        engine = next(n for n in sides if n.startswith(f"engine baseline ({dtype}:"))
        hf = f"transformers generate ({dtype})"
        if hf in outputs:
            same[dtype] = sum(a == b for a, b in zip(outputs[engine], outputs[hf], strict=True))
    return {**result, "same_tokens_as_transformers": same, "prompts": len(rows), "max_new_tokens": new,
            "prompt_tokens": [len(r) for r in rows], "kernel_paths": kernels, "cpu": describe(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| decoding | tokens/s | × fastest transformers generate |", "|---|---|---|"]
    hf_best = max((v for n, v in result["tokens_per_s"].items() if n.startswith("transformers")), default=None)
    for name, tps in result["tokens_per_s"].items():
        rel = f"{tps / hf_best:.2f}×" if hf_best else "–"
        lines.append(f"| {name} | {tps:.1f} | {rel} |")
    same = ", ".join(f"{d}: {n}/{result['prompts']}" for d, n in result["same_tokens_as_transformers"].items())
    lines.append(f"\n{result['prompts']} held-out prompts × {result['max_new_tokens']} new tokens (greedy, EOS "
                 f"ignored), prefill included, interleaved; {result['cpu']}, {result['threads']} threads, torch "
                 f"{result['torch']}. Engine output equals transformers' token for token: {same}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--dtypes", default="fp32,bf16,auto", help="engine dtypes (auto = the measured kernel path); "
                    "transformers runs fp32 and bf16")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = measure(args.target, dtypes=[d.strip() for d in args.dtypes.split(",") if d.strip()],
                     prompts=args.prompts, new=args.max_new_tokens)
    result["command"] = command_line("bench_baseline_generate.py", argv)
    print_and_save(result, markdown(result), args.json, dtype=list(result["kernel_paths"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
