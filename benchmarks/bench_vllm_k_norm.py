"""How much acceptance a multi-layer DFlash draft loses in vLLM's CPU build to its grouped K norm, measured here.

    python benchmarks/bench_vllm_k_norm.py [--draft DIR] [--num-prompts 20] [--json OUT]
"""

# vLLM's DFlash family (DFlash, DSpark, DFlash2) norms every draft layer's context keys in one grouped RMS norm
# (`DFlashQwen3Model._normalize_context_k`: `ops.rms_norm` over [L, T, kv heads, head dim] with a [L, head dim]
# weight, the row chosen per layer). Two measurements:
#   1. the CPU build's kernel, run in its own interpreter on random inputs: the largest difference from a per-layer
#      norm, and from a norm with row 0's weight on every layer;
#   2. our engine's acceptance on the bench's prompts with the draft as trained and with its context keys normed as
#      that kernel does (layer 0's k_norm weight on every layer), beside the committed vLLM record of the same draft,
#      prompts and k.

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402

DRAFT = "assets/drafts/smollm2-135m-instruct-dflash"
VLLM_RECORD = "benchmarks/results/reship-dflash/amd-epyc-zen4/vllm_bench.json"
KERNEL_CHECK = """
import json, torch
from vllm import _custom_ops as ops
torch.manual_seed(0)
x, w = torch.randn(3, 5, 2, 32), torch.rand(3, 32) + 0.5
out = torch.empty_like(x)
ops.rms_norm(out, x, w, 1e-6)
normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
print(json.dumps({"vs_per_layer": float((out - normed * w[:, None, None]).abs().max()),
                  "vs_row0": float((out - normed * w[0]).abs().max())}))
"""


def kernel_check() -> dict:
    """The CPU build's grouped rms_norm against the two readings of its weight."""
    from engine.serve.venv import vllm_venv_dir

    python = vllm_venv_dir() / "bin" / "python"
    run = subprocess.run([str(python), "-P", "-c", KERNEL_CHECK], capture_output=True, text=True, timeout=600)
    if run.returncode:
        raise SystemExit(f"vLLM's interpreter failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def row0_context_kv(self, c, positions):
    """DFlashDraft.context_kv with every layer's context keys normed by layer 0's k_norm weight (the CPU kernel)."""
    from engine.algos.common.layers import rotate_half

    cos, sin = self.rotary_emb(c, positions)
    w0 = self.layers[0].self_attn.k_norm.weight
    out = []
    for layer in self.layers:
        a = layer.self_attn
        b, t, _ = c.shape
        k = a.k_proj(c).view(b, t, a.nkv, a.hd)
        v = a.v_proj(c).view(b, t, a.nkv, a.hd).transpose(1, 2)
        kf = k.float() * (k.float().pow(2).mean(-1, keepdim=True) + a.k_norm.eps).rsqrt()
        k = (w0 * kf.to(k.dtype)).transpose(1, 2)
        out.append((k * cos.unsqueeze(1) + rotate_half(k) * sin.unsqueeze(1), v))
    return out


def acceptance(draft: str, num_prompts: int, row0: bool) -> dict:
    """`bench` (draft only) on the bench's ShareGPT prompts, k = 3, 128 tokens, as the card's record ran it."""
    from engine.algos import ALGOS
    from engine.measure.bench import benchmark
    from engine.measure.options import BenchOptions

    DFlashDraft = ALGOS.get("dflash").part("model", "DFlashDraft")  # the family's backbone, through the registry
    original = DFlashDraft.context_kv
    DFlashDraft.context_kv = row0_context_kv if row0 else original
    try:
        options = BenchOptions(target="smollm2-135m-instruct", draft=draft, prompts="sharegpt", methods="draft",
                               num_prompts=num_prompts, max_new_tokens=128, k=3)
        row = benchmark(options)["methods"]["draft"]
    finally:
        DFlashDraft.context_kv = original
    return {k: row[k] for k in ("num_drafts", "num_accepted_tokens", "mean_acceptance_length",
                                "per_position_acceptance")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", default=DRAFT, help=f"a multi-layer DFlash draft (default {DRAFT})")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--json", help="write the record here")
    a = p.parse_args(argv)
    layers = json.loads((ROOT / a.draft / "config.json").read_text())["transformer_layer_config"]["num_hidden_layers"]
    kernel = kernel_check()
    rows = {"as trained": acceptance(a.draft, a.num_prompts, False),
            "layer 0's k_norm on every layer": acceptance(a.draft, a.num_prompts, True)}
    vllm = json.loads((ROOT / VLLM_RECORD).read_text())["methods"]["draft"]
    rows["vLLM's CPU build (committed record)"] = {k: vllm[k] for k in ("num_drafts", "num_accepted_tokens",
                                                                        "mean_acceptance_length")}
    result = {"command": command_line("bench_vllm_k_norm.py", argv), "draft": a.draft, "draft_layers": layers,
              "kernel": kernel, "rows": rows, "vllm_record": VLLM_RECORD}
    table = ("| context keys | drafts | accepted | accepted per draft |\n|---|---|---|---|\n" + "\n".join(
        f"| {name} | {r['num_drafts']} | {r['num_accepted_tokens']} | "
        f"{r['num_accepted_tokens'] / r['num_drafts']:.3f} |" for name, r in rows.items()))
    table += (f"\n\nCPU build's grouped rms_norm: {kernel['vs_row0']:.1e} from row 0's weight on every layer, "
              f"{kernel['vs_per_layer']:.2f} from a per-layer norm.")
    print_and_save(result, table, a.json, dtype="bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
