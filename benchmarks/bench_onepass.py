"""Benchmark the data work per conversation: regenerate then extract (today's two steps) vs the one pass."""

# The same ShareGPT conversations (train split, prompts only, first user turn answered as the recipes do:
# --max-turns 1) on the built-in target (fp32 on the CPU), greedy, both in this process with the target loaded once:
#
# * two steps: `engine.data.regenerate.regenerate` (transformers `generate`, batches of --batch-size) into a JSONL,
#   then `render_dataset(JSONL, split=all)` and `extract_hidden_states` (a second forward over every token);
# * the same two steps with regenerate's greedy answers on the fused decoder's batch (what `regenerate` does now);
# * one pass:  `engine.data.onepass.regenerate_and_extract` (`regenerate --extract-to`): hidden states kept while
#   generating, only the tokens after each answer run again; its batch decoded on the fused decoder where the target
#   takes it (what users get), and
# * the same one pass with transformers decoding its batch (what it did before the fused batch), to tell the two
#   savings apart.
#
# Chunks of --chunk conversations (default --batch-size) take turns going first, so all ways see the same load on a
# shared machine; wall-clock and process CPU seconds are summed per way. Afterwards (not timed) the outputs are
# compared: equal JSONL rows, equal token ids and loss masks, and the largest difference of the saved hidden states.
# The vLLM regeneration path is not timed here (it needs its own server and environment; see the record's note).
#
#     python benchmarks/bench_onepass.py --conversations 24 --max-new-tokens 256 --threads 1 \
#         --json benchmarks/results/data_cost/intel-xeon-amx.json

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)
from engine.data.options import ExtractOptions, RegenerateOptions  # noqa: E402

PARTS = {"regenerate": 0.0, "extract": 0.0}  # wall seconds of the two steps, apart
PARTS_FUSED = dict(PARTS)  # the same with regenerate on the fused batch


def two_steps(target, chats, tmp: Path, layer_ids, args, *, fused: bool = False) -> None:
    from engine.data.answers.regenerate import regenerate, transformers_answers
    from engine.data.extract.dataset import extract_hidden_states
    from engine.data.render.chat import render_dataset

    name, parts = ("twof", PARTS_FUSED) if fused else ("two", PARTS)
    start = time.perf_counter()
    regenerate(target, chats,
               RegenerateOptions(out=tmp / f"{name}.jsonl", max_new_tokens=args.max_new_tokens,
                                 batch_size=args.batch_size, max_length=args.max_length, max_turns=1), progress=False,
               answer=None if fused else transformers_answers)
    parts["regenerate"] += time.perf_counter() - start
    start = time.perf_counter()
    rows, _, _ = render_dataset(str(tmp / f"{name}.jsonl"), target.tokenizer, split="all", max_length=args.max_length)
    extract_hidden_states(target, rows, ExtractOptions(out=tmp / name, dtype=args.dtype), layer_ids, progress=False)
    parts["extract"] += time.perf_counter() - start


def two_steps_fused(target, chats, tmp: Path, layer_ids, args) -> None:
    two_steps(target, chats, tmp, layer_ids, args, fused=True)


def one_pass(target, chats, tmp: Path, layer_ids, args, *, fused: bool | None = None, name: str = "one") -> None:
    from engine.data.answers.onepass import regenerate_and_extract

    regenerate_and_extract(target, chats,
                           RegenerateOptions(out=tmp / f"{name}.jsonl", extract_to=tmp / name,
                                             max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                             max_length=args.max_length, max_turns=1,
                                             extract_max_length=args.max_length, dtype=args.dtype), layer_ids,
                           progress=False, fused=fused)


def one_pass_transformers(target, chats, tmp: Path, layer_ids, args) -> None:
    one_pass(target, chats, tmp, layer_ids, args, fused=False, name="onet")


WAYS = {"two_steps": two_steps, "two_steps_fused": two_steps_fused, "one_pass": one_pass,
        "one_pass_transformers": one_pass_transformers}


def compare(tmp: Path, other: str = "one") -> dict:
    """Equal rows, token ids and loss masks of the two steps' and `other`'s outputs; the largest |difference| of the
    hidden states (and relative to |x|)."""
    from engine.data.store.files import load_sample, sample_indices

    rows = [[json.loads(x)["messages"] for x in (tmp / f"{w}.jsonl").read_text().splitlines()] for w in ("two", other)]
    out = {"rows_equal": rows[0] == rows[1], "samples": 0, "tokens_equal": True, "max_abs_diff": 0.0,
           "max_rel_diff": 0.0, "elements_differing": 0, "elements": 0}
    if sample_indices(tmp / "two") != sample_indices(tmp / other):
        return {**out, "tokens_equal": False}
    for i in sample_indices(tmp / "two"):
        a, b = load_sample(tmp / "two" / f"hs_{i}.safetensors"), load_sample(tmp / other / f"hs_{i}.safetensors")
        same = a["token_ids"].equal(b["token_ids"]) and a["loss_mask"].equal(b["loss_mask"])
        out["tokens_equal"] &= same
        if not same:
            continue
        x, y = a["hidden_states"].float(), b["hidden_states"].float()
        diff = (x - y).abs()
        out["samples"] += 1
        out["max_abs_diff"] = max(out["max_abs_diff"], diff.max().item())
        out["max_rel_diff"] = max(out["max_rel_diff"], (diff / x.abs().clamp(min=1e-3)).max().item())
        out["elements_differing"] += int((diff > 0).sum())
        out["elements"] += diff.numel()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conversations", type=int, default=24, help="ShareGPT train-split conversations")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per answer (the recipes' 256)")
    p.add_argument("--max-length", type=int, default=768, help="prompt + answer budget and extraction length")
    p.add_argument("--batch-size", type=int, default=RegenerateOptions.model_fields["batch_size"].default,
                   help="conversations generated together (regenerate's default)")
    p.add_argument("--chunk", type=int, default=None,
                   help="conversations per interleaved chunk (default: the batch size; the fused batch refills its "
                        "rows only in chunks larger than it)")
    p.add_argument("--dtype", default="bf16", help="of the saved hidden states (the recipes' bf16)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--check-dtype", default="fp32", help="files of the untimed exactness check on the first chunk")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    from engine.cpu import cpu_model, describe
    from engine.data.extract.layer_ids import resolve_layer_ids
    from engine.data.render.datasets import load_conversations
    from engine.targets.loading import load_target

    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m-instruct", dtype="fp32")
    layer_ids = resolve_layer_ids(target.num_layers)  # the default algorithm's layers plus the last
    chats, _ = load_conversations("sharegpt", split="train", max_samples=args.conversations, prompt_only=True)
    seconds = {way: 0.0 for way in WAYS}
    cpu = dict(seconds)
    checks, checks_t, checks_f = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-onepass-") as tmp:
        (Path(tmp) / "warm").mkdir()
        for way in WAYS.values():  # first-call overheads (the fused weights' packing included) are not compared
            way(target, chats[:1], Path(tmp) / "warm", layer_ids, args)
        PARTS.update(regenerate=0.0, extract=0.0)
        PARTS_FUSED.update(regenerate=0.0, extract=0.0)
        chunk_size = args.chunk or args.batch_size
        for c, k in enumerate(range(0, len(chats), chunk_size)):
            chunk, folder = chats[k: k + chunk_size], Path(tmp) / f"chunk{c}"
            folder.mkdir()
            order = list(WAYS)[c % len(WAYS):] + list(WAYS)[:c % len(WAYS)]  # each way first in turn
            for way in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                WAYS[way](target, chunk, folder, layer_ids, args)
                seconds[way] += time.perf_counter() - start
                cpu[way] += time.process_time() - start_cpu
                print(f"chunk {c}: {way} {seconds[way]:.1f} s so far", flush=True)
            checks.append(compare(folder))
            checks_t.append(compare(folder, "onet"))
            checks_f.append(compare(folder, "twof"))
            decoder = json.loads((folder / "one.jsonl").read_text().splitlines()[0])["regenerated"]["backend"]
        parts, parts_fused = dict(PARTS), dict(PARTS_FUSED)
        exact_args = argparse.Namespace(**{**vars(args), "dtype": args.check_dtype})
        folder = Path(tmp) / "exact"
        folder.mkdir()
        for way in (two_steps, one_pass):
            way(target, chats[: args.batch_size], folder, layer_ids, exact_args)
        exact = compare(folder)
    n = len(chats)
    result = {
        "command": command_line("bench_onepass.py", argv), "cpu": cpu_model(), "cpu_described": describe(),
        "dtype": args.dtype, "target_dtype": "fp32", "threads": args.threads, "conversations": n,
        "max_new_tokens": args.max_new_tokens, "max_length": args.max_length, "batch_size": args.batch_size,
        "chunk": chunk_size,
        "layer_ids": layer_ids, "seconds": seconds, "cpu_seconds": cpu,
        "per_conversation_s": {w: s / n for w, s in seconds.items()},
        "per_conversation_cpu_s": {w: s / n for w, s in cpu.items()},
        "two_steps_parts_per_conversation_s": {w: s / n for w, s in parts.items()},
        "two_steps_fused_parts_per_conversation_s": {w: s / n for w, s in parts_fused.items()},
        "one_pass_backend": decoder,
        "ratio": seconds["one_pass"] / seconds["two_steps"], "cpu_ratio": cpu["one_pass"] / cpu["two_steps"],
        "ratio_transformers_decoding": seconds["one_pass_transformers"] / seconds["two_steps"],
        "ratio_to_fused_two_steps": seconds["one_pass"] / seconds["two_steps_fused"],
        "goal_ratio": 1 / 3,
        "outputs": {"rows_equal": all(c["rows_equal"] for c in checks),
                    "tokens_equal": all(c["tokens_equal"] for c in checks),
                    "samples": sum(c["samples"] for c in checks),
                    "max_abs_diff": max(c["max_abs_diff"] for c in checks),
                    "max_rel_diff": max(c["max_rel_diff"] for c in checks),
                    "share_of_values_differing": sum(c["elements_differing"] for c in checks)
                    / max(1, sum(c["elements"] for c in checks))},
        "outputs_fused_two_steps": {"rows_equal": all(c["rows_equal"] for c in checks_f),
                                    "tokens_equal": all(c["tokens_equal"] for c in checks_f),
                                    "max_abs_diff": max(c["max_abs_diff"] for c in checks_f)},
        "outputs_transformers_decoding": {"rows_equal": all(c["rows_equal"] for c in checks_t),
                                          "tokens_equal": all(c["tokens_equal"] for c in checks_t),
                                          "max_abs_diff": max(c["max_abs_diff"] for c in checks_t)},
        "exact_check": {"dtype": args.check_dtype, "conversations": min(n, args.batch_size), **exact},
        "note": "Both ways ran interleaved chunk by chunk, so on a shared machine the ratio is the figure to trust. "
                "The vLLM regeneration path (regenerate --backend vllm, a managed server in its own environment) is "
                "not timed side by side here.",
    }
    pc = result["per_conversation_s"]
    table = ("| way | s per conversation | CPU s per conversation |\n|---|---|---|\n"
             f"| regenerate (transformers), then extract | {pc['two_steps']:.2f} | "
             f"{result['per_conversation_cpu_s']['two_steps']:.2f} |\n"
             f"| regenerate (fused batch), then extract | {pc['two_steps_fused']:.2f} | "
             f"{result['per_conversation_cpu_s']['two_steps_fused']:.2f} |\n"
             f"| one pass (regenerate --extract-to), {decoder} | {pc['one_pass']:.2f} | "
             f"{result['per_conversation_cpu_s']['one_pass']:.2f} |\n"
             f"| one pass, transformers decoding | {pc['one_pass_transformers']:.2f} | "
             f"{result['per_conversation_cpu_s']['one_pass_transformers']:.2f} |\n"
             f"\none pass / two steps: {result['ratio']:.2f} (CPU {result['cpu_ratio']:.2f}); goal <= 0.33; "
             f"to the two steps with the fused regenerate: {result['ratio_to_fused_two_steps']:.2f}. "
             f"Hidden states ({args.dtype} files): max |diff| {result['outputs']['max_abs_diff']:.3g}; "
             f"{args.check_dtype} check: max |diff| {exact['max_abs_diff']:.3g}")
    print_and_save(result, table, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
