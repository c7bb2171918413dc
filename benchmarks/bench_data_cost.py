"""Benchmark the data work per conversation on this CPU: the recipes' way against the vLLM-only way, same data."""

# The same ShareGPT train-split conversations (first user turn, as the recipes answer it), greedy, up to
# --max-new-tokens new tokens within --max-length, then the hidden states of EAGLE-3's layers [2, 15, 27] + 30
# in bf16, built-in target:
#
# * recipe way:  `regenerate --backend vllm --batch-size 32` (a managed vLLM server, 32 requests in flight, as
#                configs/smollm2-*.yaml run it), then `extract` with the transformers backend (fp32 target in this
#                process, the second forward);
# * vLLM way:    `regenerate --backend vllm --batch-size --wide` (more requests in flight: vLLM batches them),
#                then `extract --backend vllm` (vLLM's `extract_hidden_states` in its own environment; on a CPU
#                build through the workbench's CPU connector: prefill only, one generated token per row);
# * one pass:    `regenerate --extract-to` in this process (fp32 target, greedy answers on the fused decoder's batch
#                of --onepass-batch conversations, the states kept while generating).
#
# Each part is timed apart, and so is its fixed start (the vLLM server or worker starting, the target loading), so
# that a per-conversation cost is the steady one a long data budget pays; the starts are listed beside it. The
# parts run one after the other (never two at a time), each way's order alternating over --rounds rounds of
# --conversations fresh conversations each. Afterwards (not timed) the two ways' samples are compared: the JSONL
# rows, token ids and loss masks, and how far the bf16 states are apart (the server and worker run the target in
# bf16, transformers in fp32, so the regenerated answers may differ where two tokens were nearly tied).
#
#     python benchmarks/bench_data_cost.py --conversations 96 --rounds 2 --json benchmarks/results/data_cost/<cpu>.json

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._results import command_line, print_and_save  # noqa: E402  (the repo root is on the path now)
from engine.data.options import ExtractOptions, RegenerateOptions  # noqa: E402

TARGET = "smollm2-135m-instruct"
WAYS = ("recipe", "vllm", "onepass")


def regenerate_part(chats, out: Path, concurrency: int, args) -> dict:
    """(start seconds, generation seconds) of regenerating `chats` through a managed vLLM server."""
    from engine.data.answers.regenerate import regenerate, tokenizer_only
    from engine.data.answers.vllm import VllmAnswerer

    model = tokenizer_only(TARGET)
    start = time.perf_counter()
    with VllmAnswerer(TARGET, concurrency=concurrency) as answer:
        started = time.perf_counter() - start
        summary = regenerate(model, chats,
                             RegenerateOptions(out=out, max_new_tokens=args.max_new_tokens, batch_size=concurrency,
                                               max_length=args.max_length, max_turns=1), answer=answer, progress=False)
    return {"start_s": started, "s": summary.seconds, "new_tokens": summary.new_tokens,
            "conversations": summary.written}


def transformers_extract_part(jsonl: Path, out: Path, layer_ids, args) -> dict:
    from engine.data.extract.dataset import extract_hidden_states
    from engine.data.render.chat import render_dataset
    from engine.targets.loading import load_target

    start = time.perf_counter()
    target = load_target(TARGET, dtype="fp32")
    started = time.perf_counter() - start
    start = time.perf_counter()
    rows, _, _ = render_dataset(str(jsonl), target.tokenizer, split="all", max_length=args.max_length)
    extract_hidden_states(target, rows, ExtractOptions(out=out, dtype="bf16"), layer_ids, progress=False)
    return {"start_s": started, "s": time.perf_counter() - start, "tokens": sum(r.num_tokens for r in rows)}


def vllm_extract_part(jsonl: Path, out: Path, layer_ids, args) -> dict:
    """`extract --backend vllm`, with the worker's start timed apart from the extraction (extract_rows_vllm's steps)."""
    from transformers import AutoConfig

    from engine.data.answers.regenerate import tokenizer_only
    from engine.data.extract.run import ExtractionRun, TargetInfo, build_header
    from engine.data.extract.vllm import DEFAULT_CHUNK, collect, staging_dir, vllm_files
    from engine.data.render.chat import render_dataset
    from engine.targets.resolve import resolve_target

    ref = resolve_target(TARGET)
    rows, _, _ = render_dataset(str(jsonl), tokenizer_only(TARGET).tokenizer, split="all", max_length=args.max_length)
    header = build_header(TargetInfo.from_config(ref, AutoConfig.from_pretrained(ref.path)), layer_ids, "bf16",
                          backend="vllm")
    storage = staging_dir(out.parent)
    try:
        with ExtractionRun(out, header, rows) as run:
            start = time.perf_counter()
            with vllm_files(str(ref.path), layer_ids, storage, dtype=header["dtype"],
                            llm_extra={"max_model_len": max(r.num_tokens for r in rows) + 1}) as files:
                started = time.perf_counter() - start
                start = time.perf_counter()
                todo = run.pending
                for k in range(0, len(todo), DEFAULT_CHUNK):
                    indices = todo[k: k + DEFAULT_CHUNK]
                    for i, path in zip(indices, files([list(rows[i].input_ids) for i in indices]), strict=True):
                        collect(run, i, path)
                seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return {"start_s": started, "s": seconds, "tokens": sum(r.num_tokens for r in rows)}


def onepass_part(chats, jsonl: Path, out: Path, layer_ids, args) -> dict:
    """`regenerate --extract-to` in process; its start is the target's load and a one-conversation warm-up."""
    from engine.data.answers.onepass import regenerate_and_extract
    from engine.targets.loading import load_target

    def run(rows, jsonl: Path, out: Path, max_new_tokens: int):
        return regenerate_and_extract(target, rows, RegenerateOptions(
            out=jsonl, extract_to=out, max_new_tokens=max_new_tokens, batch_size=args.onepass_batch,
            max_length=args.max_length, max_turns=1, extract_max_length=args.max_length, dtype="bf16"), layer_ids,
            progress=False)

    start = time.perf_counter()
    target = load_target(TARGET, dtype="fp32")
    with tempfile.TemporaryDirectory(prefix="warm-") as warm:  # the fused weights are packed at the first call
        run(chats[:1], Path(warm) / "w.jsonl", Path(warm) / "w", 4)
    started = time.perf_counter() - start
    start = time.perf_counter()
    summary = run(chats, jsonl, out, args.max_new_tokens)
    return {"start_s": started, "s": time.perf_counter() - start, "new_tokens": summary.new_tokens,
            "conversations": summary.written}


def compare(folder: Path, other: str = "vllm") -> dict:
    """Equal JSONL rows of the recipe way and `other`; for the samples whose token ids and loss masks agree, how far
    the bf16 states are apart."""
    from engine.data.store.files import load_sample, sample_indices

    rows = [[json.loads(x)["messages"] for x in (folder / f"{w}.jsonl").read_text().splitlines()]
            for w in ("recipe", other)]
    # strict=False: a way may drop a row it could not answer
    out = {"conversations": len(rows[0]), "rows_equal": sum(a == b for a, b in zip(*rows, strict=False)),
           "samples_equal": 0,
           "samples": len(sample_indices(folder / "recipe")), "max_abs_diff": 0.0, "mean_abs_diff": 0.0}
    diffs = []
    for i in sample_indices(folder / "recipe"):
        theirs = folder / other / f"hs_{i}.safetensors"
        if not theirs.exists():
            continue
        a, b = load_sample(folder / "recipe" / f"hs_{i}.safetensors"), load_sample(theirs)
        if a["token_ids"].equal(b["token_ids"]) and a["loss_mask"].equal(b["loss_mask"]):
            out["samples_equal"] += 1
            d = (a["hidden_states"].float() - b["hidden_states"].float()).abs()
            diffs.append(d.mean().item())
            out["max_abs_diff"] = max(out["max_abs_diff"], d.max().item())
            out["rel_rms_diff"] = max(out.get("rel_rms_diff", 0.0), (d.pow(2).mean() / a["hidden_states"].float()
                                                                     .pow(2).mean()).sqrt().item())
    out["mean_abs_diff"] = sum(diffs) / len(diffs) if diffs else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conversations", type=int, default=96, help="new ShareGPT train-split conversations per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the ways' order alternating")
    p.add_argument("--max-new-tokens", type=int, default=256, help="per answer (the recipes' 256)")
    p.add_argument("--max-length", type=int, default=768, help="prompt + answer budget and extraction length")
    p.add_argument("--recipe-batch", type=int, default=32, help="requests in flight, the recipe way (the recipes' 32)")
    p.add_argument("--wide", type=int, default=256, help="requests in flight, the vLLM way")
    p.add_argument("--threads", type=int, default=2, help="torch threads in this process (extraction, one pass)")
    p.add_argument("--onepass-batch", type=int, default=RegenerateOptions.model_fields["batch_size"].default,
                   help="conversations decoded together, the one pass (regenerate's default)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    from engine.cpu import cpu_model, describe
    from engine.data.extract.layer_ids import resolve_layer_ids
    from engine.data.render.datasets import load_conversations

    torch.set_num_threads(args.threads)
    layer_ids = resolve_layer_ids(30, None, "eagle3")
    chats, _ = load_conversations("sharegpt", split="train", max_samples=args.conversations * args.rounds,
                                  prompt_only=True)
    parts = {w: {"regenerate": [], "extract": []} for w in WAYS}
    checks, checks_onepass = [], []
    with tempfile.TemporaryDirectory(prefix="bench-data-cost-") as tmp:
        for r in range(args.rounds):
            chunk, folder = chats[r * args.conversations:(r + 1) * args.conversations], Path(tmp) / f"round{r}"
            folder.mkdir()
            for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:  # each way first in turn
                jsonl = folder / f"{way}.jsonl"
                if way == "onepass":  # regeneration and extraction in one: all of it counts as regeneration
                    regen, extract = onepass_part(chunk, jsonl, folder / way, layer_ids, args), {"s": 0.0,
                                                                                                "start_s": 0.0}
                else:
                    regen = regenerate_part(chunk, jsonl, args.recipe_batch if way == "recipe" else args.wide, args)
                    extract = (transformers_extract_part if way == "recipe" else vllm_extract_part)(
                        jsonl, folder / way, layer_ids, args)
                parts[way]["regenerate"].append(regen)
                parts[way]["extract"].append(extract)
                print(f"round {r + 1} {way}: regenerate {regen['s']:.1f} s (+{regen['start_s']:.0f} s start), "
                      f"extract {extract['s']:.1f} s (+{extract['start_s']:.0f} s start)", flush=True)
            checks.append(compare(folder))
            checks_onepass.append(compare(folder, "onepass"))
    n = sum(x["conversations"] for x in parts["recipe"]["regenerate"])  # rows written (some prompts are skipped)
    if any(n != sum(x["conversations"] for x in parts[w]["regenerate"]) for w in WAYS):
        raise SystemExit("the ways regenerated different numbers of conversations")

    def per_conv(way: str, part: str) -> float:
        return sum(x["s"] for x in parts[way][part]) / n

    per = {w: {part: per_conv(w, part) for part in ("regenerate", "extract")} for w in WAYS}
    for w in WAYS:
        per[w]["total"] = per[w]["regenerate"] + per[w]["extract"]
    starts = {w: {part: sum(x["start_s"] for x in parts[w][part]) / args.rounds for part in ("regenerate", "extract")}
              for w in WAYS}
    ratio = per["vllm"]["total"] / per["recipe"]["total"]
    onepass_ratio = per["onepass"]["total"] / per["recipe"]["total"]
    result = {"command": command_line("bench_data_cost.py", argv), "cpu": cpu_model(), "cpu_described": describe(),
              "conversations": n, "prompts": args.conversations * args.rounds, "rounds": args.rounds,
              "max_new_tokens": args.max_new_tokens,
              "max_length": args.max_length, "recipe_batch": args.recipe_batch, "wide": args.wide,
              "threads": args.threads, "layer_ids": layer_ids, "dtype": "bf16", "parts": parts,
              "onepass_batch": args.onepass_batch, "target_dtype_onepass": "fp32",
              "per_conversation_s": per, "starts_s": starts, "ratio": ratio, "onepass_ratio": onepass_ratio,
              "checks": checks, "checks_onepass": checks_onepass}
    print_and_save(result, table(result), args.json)
    return 0


def table(result: dict) -> str:
    """The per-conversation table of a record, and the ratio line."""
    per, starts = result["per_conversation_s"], result["starts_s"]
    names = {"recipe": f"recipe way: vLLM server ({result['recipe_batch']} in flight), then transformers extract",
             "vllm": f"vLLM way: vLLM server ({result['wide']} in flight), then vLLM extract",
             "onepass": f"one pass in process: regenerate --extract-to ({result.get('onepass_batch')} at a time, "
                        "fused batch, fp32)"}
    lines = ["| way | regenerate s/conv | extract s/conv | total s/conv | starts (s, once per run) |",
             "|---|---|---|---|---|"]
    for w in (w for w in WAYS if w in per):  # records before the one pass have two ways
        lines.append(f"| {names[w]} | {per[w]['regenerate']:.3f} | {per[w]['extract']:.3f} | {per[w]['total']:.3f} | "
                     f"{starts[w]['regenerate']:.0f} + {starts[w]['extract']:.0f} |")
    ratios = f"\n\nvLLM way / recipe way: {result['ratio']:.2f} per conversation (goal: 1/3 or less)"
    if "onepass_ratio" in result:
        ratios += f"; one pass / recipe way: {result['onepass_ratio']:.2f}"
    return "\n".join(lines) + ratios


if __name__ == "__main__":
    sys.exit(main())
