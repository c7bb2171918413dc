"""`prepare`, `regenerate`, `extract`: render data with loss masks, re-answer it with the target, extract states."""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_MAX_LENGTH = 2048
# Kept here so that building the parser imports no torch (tests check they match engine.data).
BACKENDS = ("transformers", "vllm")
DEFAULT_BATCH_SIZE = 16
DEFAULT_BATCH_TOKENS = 4096


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _add_data_arguments(p: argparse.ArgumentParser, *, max_length: int | None = DEFAULT_MAX_LENGTH) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="sharegpt",
                   help="built-in name (sharegpt) or a local .jsonl/.json/.parquet file or `save_to_disk` folder "
                   "(default: sharegpt)")
    g.add_argument("--target", default=None,
                   help="built-in target name, local model folder or cached hub id (default: smollm2-135m-instruct)")
    g.add_argument("--split", choices=["train", "val", "all"], default="train",
                   help="deterministic split by a hash of the row id (default: train; val is held out for benchmarks)")
    g.add_argument("--val-fraction", type=float, default=0.02, help="share of rows in the val split (default: 0.02)")
    g.add_argument("--seed", type=int, default=0, help="seed of the split hash (default: 0)")
    g.add_argument("--max-samples", type=_positive, default=None, help="use the first N rows of the split")
    g.add_argument("--max-length", type=_positive, default=max_length,
                   help=f"truncate rendered rows to N tokens (default: {max_length})")


# -- prepare ---------------------------------------------------------------------------------------


def add_prepare_arguments(p: argparse.ArgumentParser) -> None:
    _add_data_arguments(p)
    p.add_argument("--out", default=None, help="write the tokenised rows (id, input_ids, loss_mask) to this JSONL")
    p.add_argument("--preview", type=int, default=1, help="rows to preview with loss tokens marked (default: 1)")
    p.add_argument("--preview-chars", type=int, default=2000, help="cut each preview after N characters")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (no preview)")


def run_prepare(args: argparse.Namespace) -> int:
    from engine.data.render import format_segments, mask_segments, render_dataset
    from engine.fsutil import atomic_write_text
    from engine.jobs import reporter
    from engine.targets import load_target

    reporter().update("loading target")
    target = load_target(args.target, with_tokenizer=True)
    reporter().update("rendering dataset")
    rows, summary, stats = render_dataset(args.dataset, target.tokenizer, split=args.split,
                                          max_samples=args.max_samples, max_length=args.max_length,
                                          val_fraction=args.val_fraction, seed=args.seed)
    if args.out:
        atomic_write_text(args.out, "".join(json.dumps(r.to_json()) + "\n" for r in rows))
    result = {**summary.to_json(), **{f"rendered_{k}": v for k, v in stats.to_json().items()},
              "max_length": args.max_length, "out": args.out}
    reporter().update("done", 1.0, **{k: v for k, v in result.items() if not isinstance(v, dict)})
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(summary.format())
    print(f"rendered {stats.rows} rows: {stats.tokens} tokens, {stats.loss_tokens} loss tokens "
          f"({stats.truncated} truncated to {args.max_length})" + (f"; wrote {args.out}" if args.out else ""))
    color = sys.stdout.isatty()
    for row in rows[: max(0, args.preview)]:
        text = format_segments(mask_segments(target.tokenizer, row.input_ids, row.loss_mask), color=color)
        cut = len(text) > args.preview_chars
        print(f"\n--- row {row.id} ({row.num_tokens} tokens, {row.num_loss_tokens} loss tokens"
              f"{'; loss tokens in green' if color else '; loss tokens between ⟦ ⟧'}) ---")
        print(text[: args.preview_chars] + (" […]" if cut else ""))
    return 0


def _add_layer_arguments(p) -> None:
    """--layers / --algo (which hidden states to keep) and --dtype (how they are saved)."""
    layers = p.add_mutually_exclusive_group()
    layers.add_argument("--layers", default=None,
                        help="comma-separated layer ids, e.g. 2,15,27,30 (id N = last layer before the final norm)")
    from engine.algos import default_algo
    from engine.data.layer_ids import default_layer_ids, layer_algorithms

    examples = "; ".join(f"{a} {default_layer_ids(30, a)}" for a in layer_algorithms())
    layers.add_argument("--algo", choices=layer_algorithms(), default=None,
                        help=f"the algorithm's default ids plus N (for a 30-layer target: {examples}; plus 30) "
                        f"(default: {default_algo()})")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16",
                   help="dtype of the saved hidden states (default: bf16)")


# -- regenerate ------------------------------------------------------------------------------------


def add_regenerate_arguments(p: argparse.ArgumentParser) -> None:
    _add_data_arguments(p, max_length=None)
    p.add_argument("--out", required=True, help="JSONL file of regenerated conversations (appended; resumable)")
    p.add_argument("--max-new-tokens", type=_positive, default=256, help="per answer (default: 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling when temperature > 0 (default: 1)")
    p.add_argument("--batch-size", type=_positive, default=8, help="conversations generated together (default: 8)")
    p.add_argument("--max-turns", type=_positive, default=None, help="answer at most N user turns per conversation")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--backend", choices=["transformers", "vllm"], default="transformers",
                   help="transformers generate in this process, or a managed vLLM server (continuous batching; much "
                        "faster, bf16; --batch-size requests in flight)")
    g = p.add_argument_group("one pass: extract hidden states while generating")
    g.add_argument("--extract-to", default=None,
                   help="also write the hidden states `extract --dataset OUT --split all` would write into this "
                   "folder, kept while the target generates (no second forward; greedy, transformers backend)")
    _add_layer_arguments(g)
    g.add_argument("--extract-max-length", type=_positive, default=DEFAULT_MAX_LENGTH,
                   help=f"truncate the extracted conversations to N tokens, as extract --max-length "
                   f"(default: {DEFAULT_MAX_LENGTH})")


def run_regenerate(args: argparse.Namespace) -> int:
    from engine.data.regenerate_dataset import regenerate_dataset
    from engine.jobs import reporter

    options = {k: v for k, v in vars(args).items() if k not in ("command", "_module", "verbose", "debug")}
    result = regenerate_dataset(**options)
    reporter().update("done", 1.0, **{k: v for k, v in result.to_json().items() if not isinstance(v, dict)})
    print(json.dumps(result.to_json(), indent=2))
    return 0


# -- extract ---------------------------------------------------------------------------------------


def add_extract_arguments(p: argparse.ArgumentParser) -> None:
    _add_data_arguments(p)
    p.add_argument("--out", required=True, help="folder for hs_{i}.safetensors, manifest.json, token_freq.safetensors")
    _add_layer_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="transformers",
                   help="transformers (CPU or one GPU) or vllm (CUDA; large targets, tensor parallel)")
    p.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH_SIZE,
                   help=f"max sequences per forward (default: {DEFAULT_BATCH_SIZE})")
    p.add_argument("--batch-tokens", type=_positive, default=DEFAULT_BATCH_TOKENS,
                   help=f"max padded tokens per forward, bounds memory (default: {DEFAULT_BATCH_TOKENS})")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (transformers backend; default: cuda if available)")
    p.add_argument("--target-dtype", choices=["bf16", "fp16", "fp32"], default=None,
                   help="dtype to run the target in (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--tensor-parallel-size", type=_positive, default=1, help="GPUs per target (vllm backend)")
    p.add_argument("--overwrite", action="store_true", help="delete samples of an earlier run in --out first")
    p.add_argument("--verify", action="store_true", help="then check every file fully, as `check --full` does")


def run_extract(args: argparse.Namespace) -> int:
    from engine.data.extract import extract_dataset
    from engine.jobs import reporter

    manifest = extract_dataset(
        args.target, args.dataset, args.out, layers=args.layers, algo=args.algo, split=args.split,
        max_samples=args.max_samples, max_length=args.max_length, dtype=args.dtype, backend=args.backend,
        batch_size=args.batch_size, batch_tokens=args.batch_tokens, device=args.device,
        target_dtype=args.target_dtype, val_fraction=args.val_fraction, seed=args.seed, overwrite=args.overwrite,
        tensor_parallel_size=args.tensor_parallel_size)
    reporter().update(f"extracted {manifest['samples']} samples", 1.0, samples=manifest["samples"],
                      tokens=manifest["tokens"], out=str(args.out))
    print(json.dumps(manifest, indent=2))
    if args.verify:
        from engine.commands.check import run as run_check

        return run_check(argparse.Namespace(data=args.out, full=True, json=False))
    return 0
