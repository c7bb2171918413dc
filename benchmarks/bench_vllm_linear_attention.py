"""Whether vLLM's CPU build decodes speculatively beside linear-attention layers as its baseline does."""

# A tiny random Qwen3-Next target (Gated DeltaNet layers between full attention ones, head sizes of 128 as published)
# and, as the control, a tiny random Qwen3 target of the same width are served by the vLLM CPU build in bf16 (the
# only dtype its Gated DeltaNet kernels take), alone and with n-gram drafts (k = 3; prefix caching off, since its
# Mamba cache's prefix mode runs Triton kernels). Greedy output of 6 prompts, 32 tokens each, is compared with the
# baseline's. n-gram drafts need no trained draft, so a difference is the server's, not a draft's.
#
#     .venv/bin/python benchmarks/bench_vllm_linear_attention.py \
#         --json benchmarks/results/vllm_cpu_linear_attention/amd-epyc-avx2.json

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [{"prompt": "The quick brown fox"}, {"prompt": "1 2 3 4 5 6"},
           {"messages": [{"role": "user", "content": "Hello, how are you today?"}]},
           {"messages": [{"role": "user", "content": "def add(a, b):"}]},
           {"messages": [{"role": "user", "content": "Answer the question with a short and helpful reply."}]},
           {"messages": [{"role": "user", "content": "Tell me about speculative decoding."}]}]


def measure(family: str, root: Path, pool, args) -> dict:
    from engine.measure.options import BenchOptions
    from engine.measure.vllm_bench import run_vllm_bench

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import save_tiny_target

    target = save_tiny_target(root / family, family, hidden_size=128)
    options = BenchOptions(target=str(target), methods="baseline,ngram", k=args.k, max_new_tokens=args.max_new_tokens,
                           dtype="bfloat16")
    run = run_vllm_bench(PROMPTS, options, tokenize=True, pool=pool)["methods"]["ngram"]
    return {"family": family, "identical_to_baseline": run["identical_to_baseline"],
            "first_divergence": run["first_divergence"], "num_drafts": run.get("num_drafts"),
            "num_accepted_tokens": run.get("num_accepted_tokens")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=3, help="n-gram tokens proposed per step")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per prompt")
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args(argv)

    from benchmarks._results import command_line, print_and_save
    from engine.format.vllm_rules import CPU_BUILD_LABEL
    from engine.serve.server import ServerPool
    from engine.serve.venv import ensure_vllm_env

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pool = ServerPool(root=Path(tmp) / "servers", venv=ensure_vllm_env(), lossless_only=False)
        try:
            for family in ("qwen3_next", "qwen3"):
                rows.append(measure(family, Path(tmp), pool, args))
        finally:
            pool.close()
    table = "\n".join(["| target | identical to vLLM alone | first differing token per prompt | drafts |",
                       "|---|---|---|---|"] +
                      [f"| {r['family']} | {r['identical_to_baseline']} | {r['first_divergence']} | {r['num_drafts']} |"
                       for r in rows])
    result = {"command": command_line("bench_vllm_linear_attention.py", argv), "dtype": "bf16",
              "vllm": CPU_BUILD_LABEL, "k": args.k, "max_new_tokens": args.max_new_tokens,
              "prompts": len(PROMPTS), "rows": rows}
    print_and_save(result, table, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
