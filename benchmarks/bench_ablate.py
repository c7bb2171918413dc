"""What a part of a trained draft buys: decoding-exact acceptance as trained and with named tensors zeroed."""

# The draft folder is copied into a temporary folder with every tensor whose name contains one of `--zero` set to 0
# (the config and the other tensors unchanged), and both drafts are evaluated with `engine evaluate`'s decoding walk
# on the same held-out prompts (the target answers them once; the answer store keeps them). For DFlash2, zeroing
# `candidate_selector.successor_codebook` turns the selector's scores into the unary logits, so its walk drafts
# the plain argmax: the difference is what the selector adds at the trained rank.
#
#     .venv/bin/python benchmarks/bench_ablate.py --draft runs/recipes/smollm2-dflash2/train/draft \
#         --zero candidate_selector.successor_codebook --num-prompts 20 --max-new-tokens 128 --ks 1,3,5,7 \
#         --json benchmarks/results/dflash2-recipe/amd-epyc-zen4/selector-ablation.json

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def zeroed_copy(draft: Path, names: list[str], dest: Path) -> list[str]:
    """Copy `draft` into `dest` with the tensors whose names contain one of `names` zeroed; their names."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(draft, dest, dirs_exist_ok=True)
    zeroed: list[str] = []
    for file in sorted(dest.glob("*.safetensors")):
        tensors = load_file(file)
        hits = [n for n in tensors if any(part in n for part in names)]
        if hits:
            for n in hits:
                tensors[n] = tensors[n].new_zeros(tensors[n].shape)
            save_file(tensors, file, metadata={"format": "pt"})
            zeroed += hits
    if not zeroed:
        raise SystemExit(f"no tensor of {draft} has a name containing {', '.join(names)}")
    return sorted(zeroed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft", required=True)
    parser.add_argument("--zero", action="append", required=True, help="a tensor name (or part of one) to zero")
    parser.add_argument("--target", default=None)
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--ks", default="1,3,5,7")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from benchmarks._results import command_line, print_and_save
    from engine.measure.evaluate import evaluate_draft
    from engine.measure.options import EvaluateOptions

    ks = [int(k) for k in args.ks.split(",")]

    def evaluate(folder: Path) -> dict:
        options = EvaluateOptions(draft=str(folder), target=args.target, dataset=args.dataset,
                                  num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, k=ks,
                                  forecast=False, dtype=args.dtype)
        return evaluate_draft(options, progress=False)

    with tempfile.TemporaryDirectory(prefix="ablate-") as tmp:
        zeroed = zeroed_copy(Path(args.draft), args.zero, Path(tmp) / "draft")
        trained, ablated = evaluate(Path(args.draft)), evaluate(Path(tmp) / "draft")
    rows = []
    for k in ks:
        a, b = trained["by_k"][str(k)], ablated["by_k"][str(k)]
        rows.append({"k": k, "as_trained": a["mean_acceptance_length"], "zeroed": b["mean_acceptance_length"],
                     "difference": a["mean_acceptance_length"] - b["mean_acceptance_length"]})
    table = "\n".join(["| k | τ as trained | τ with the tensors zeroed | difference |", "|---|---|---|---|",
                       *(f"| {r['k']} | {r['as_trained']:.3f} | {r['zeroed']:.3f} | {r['difference']:+.3f} |"
                         for r in rows)])
    result = {"command": command_line("bench_ablate.py", argv), "draft": args.draft,
              "draft_sha256": trained.get("draft_sha256"), "zeroed": zeroed, "rows": rows,
              "num_samples": trained["num_samples"], "max_new_tokens": args.max_new_tokens,
              "target_dtype": trained["target_dtype"], "as_trained": trained, "with_zeroed": ablated}
    print_and_save(result, table, args.json, dtype=trained["target_dtype"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
