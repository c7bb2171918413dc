"""Benchmark hidden-state extraction: our extractor against the naive loop a newcomer would write."""

# Both extract the same ShareGPT samples (train split, rendered with the built-in target's chat template and
# truncated to --max-length tokens) from the built-in SmolLM2-135M-Instruct on the CPU:
#
# * ours:  `engine.data.extract.extract_hidden_states`, layers [2, 15, 27, 30], bf16 files, default batching
#          (length-sorted, right-padded batches under a token budget; hooks stop before the final norm/lm_head).
# * naive: one sample at a time, `model(ids, output_hidden_states=True)`, every layer saved with `torch.save`
#          as fp32 [31, T, H] (the full forward, lm_head included).
#
# The machine is shared and noisy, so speed is measured twice:
# * interleaved (the ratio to trust): one process runs both methods on the same chunks of --chunk samples,
#   alternating which goes first, so both see the same load; tokens/s = all tokens / summed time per method,
#   and tokens per CPU-second (process CPU time, all threads; with --threads 1 it barely depends on the load).
# * isolated: each method in its own fresh subprocess (--rounds times, medians), which also gives bytes per
#   token on disk and peak memory (the process's max RSS, and the peak RSS increase over the loaded model,
#   sampled every 5 ms).
#
#     .venv/bin/python benchmarks/bench_extract.py --samples 100 --max-length 256 --rounds 1 --threads 2

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYERS = [2, 15, 27, 30]


class RssPeak:
    """Sample this process's RSS in a thread; `.peak` is the highest value seen (bytes)."""

    def __init__(self, every_s: float = 0.005):
        import psutil

        self.proc = psutil.Process()
        self.every_s = every_s
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.every_s)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def run_naive(target, rows, out: Path) -> None:
    import torch

    model = target.model
    with torch.no_grad():
        for i, row in enumerate(rows):
            ids = torch.tensor([row["input_ids"]])
            hidden = model(ids, output_hidden_states=True).hidden_states  # N+1 tensors [1, T, H]
            torch.save({"hidden_states": torch.stack(hidden)[:, 0], "input_ids": ids[0],
                        "loss_mask": torch.tensor(row["loss_mask"])}, out / f"sample_{i}.pt")


def run_ours(target, rows, out: Path) -> None:
    from engine.data.extract.dataset import extract_hidden_states
    from engine.data.options import ExtractOptions
    from engine.data.render.chat import RenderedRow

    rendered = [RenderedRow(r["id"], r["input_ids"], r["loss_mask"]) for r in rows]
    extract_hidden_states(target, rendered, ExtractOptions(out=out, dtype="bf16"), LAYERS, progress=False)


def _load(rows_file: Path, threads: int):
    import logging

    import torch

    from engine.targets.loading import load_target

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(threads)
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    target = load_target("smollm2-135m-instruct")
    with torch.no_grad():  # warm-up: first-call overheads are not what we compare
        target.model(torch.tensor([rows[0]["input_ids"][:16]]))
    return target, rows


def interleaved(rows_file: Path, out: Path, threads: int, chunk: int) -> dict:
    """Both methods on the same chunks, alternating order: their time ratio cancels the machine's load swings."""
    target, rows = _load(rows_file, threads)
    seconds = {"naive": 0.0, "ours": 0.0}
    cpu = {"naive": 0.0, "ours": 0.0}
    for k in range(0, len(rows), chunk):
        part = rows[k: k + chunk]
        order = ("naive", "ours") if (k // chunk) % 2 == 0 else ("ours", "naive")
        for method in order:
            folder = out / method / f"chunk{k}"
            folder.mkdir(parents=True)
            start, start_cpu = time.perf_counter(), time.process_time()
            (run_naive if method == "naive" else run_ours)(target, part, folder)
            seconds[method] += time.perf_counter() - start
            cpu[method] += time.process_time() - start_cpu
            shutil.rmtree(folder)  # keep the disk (and page cache) footprint small
    tokens = sum(len(r["input_ids"]) for r in rows)
    return {m: {"seconds": s, "tokens_per_s": tokens / s, "cpu_seconds": cpu[m], "tokens_per_cpu_s": tokens / cpu[m]}
            for m, s in seconds.items()}


def worker(method: str, rows_file: Path, out: Path, threads: int) -> dict:
    """One measured run in this (fresh) process; returns its numbers."""
    target, rows = _load(rows_file, threads)
    out.mkdir(parents=True, exist_ok=True)
    base = RssPeak().proc.memory_info().rss
    with RssPeak() as peak:
        start, start_cpu = time.perf_counter(), time.process_time()
        (run_naive if method == "naive" else run_ours)(target, rows, out)
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - start_cpu
    tokens = sum(len(r["input_ids"]) for r in rows)
    data_bytes = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith(("hs_", "sample_")))
    return {"method": method, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "cpu_seconds": cpu_seconds, "tokens_per_cpu_s": tokens / cpu_seconds,
            "bytes_per_token": data_bytes / tokens, "disk_bytes": folder_bytes(out),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_increase_mb": (peak.peak - base) / 2**20}


def prepare_rows(samples: int, max_length: int, path: Path) -> dict:
    from transformers import AutoTokenizer

    from engine.data.render.chat import render_dataset
    from engine.targets.resolve import resolve_target

    tokenizer = AutoTokenizer.from_pretrained(resolve_target("smollm2-135m-instruct").path)
    rows, _, stats = render_dataset("sharegpt", tokenizer, split="train", max_samples=samples, max_length=max_length)
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    return stats.to_json()


def spawn(method: str, rows_file: Path, out: Path, threads: int, chunk: int = 10) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--rows", str(rows_file), "--out", str(out),
           "--threads", str(threads), "--chunk", str(chunk)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"{method} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--rounds", type=int, default=1, help="isolated naive/ours subprocess pairs (medians)")
    p.add_argument("--chunk", type=int, default=10, help="samples per interleaved chunk")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--worker", choices=["naive", "ours", "interleaved"], help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "interleaved":
        print(json.dumps(interleaved(Path(args.rows), Path(args.out), args.threads, args.chunk)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.rows), Path(args.out), args.threads)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        tmp = Path(tmp)
        stats = prepare_rows(args.samples, args.max_length, tmp / "rows.jsonl")
        print(f"{stats['rows']} ShareGPT samples, {stats['tokens']} tokens (<= {args.max_length} each), "
              f"{args.threads} threads", flush=True)
        inter = spawn("interleaved", tmp / "rows.jsonl", tmp / "interleaved", args.threads, args.chunk)
        print(f"  interleaved: naive {inter['naive']['tokens_per_s']:.1f} tok/s "
              f"({inter['naive']['tokens_per_cpu_s']:.1f} per CPU-s), ours {inter['ours']['tokens_per_s']:.1f} tok/s "
              f"({inter['ours']['tokens_per_cpu_s']:.1f} per CPU-s)", flush=True)
        runs: dict[str, list[dict]] = {"naive": [], "ours": []}
        for r in range(args.rounds):
            for method in ("naive", "ours"):
                res = spawn(method, tmp / "rows.jsonl", tmp / f"{method}-{r}", args.threads)
                runs[method].append(res)
                print(f"  round {r + 1} {method:5s}: {res['tokens_per_s']:7.1f} tok/s  ({res['seconds']:.1f} s)",
                      flush=True)
    summary = {m: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "method"} for m, rs in runs.items()}
    ratio = inter["ours"]["tokens_per_s"] / inter["naive"]["tokens_per_s"]
    isolated_ratio = summary["ours"]["tokens_per_s"] / summary["naive"]["tokens_per_s"]
    cpu_ratio = inter["ours"]["tokens_per_cpu_s"] / inter["naive"]["tokens_per_cpu_s"]
    print("\n| method | tokens/s interleaved | tokens per CPU-s interleaved | tokens/s isolated (median) "
          "| bytes/token on disk | max RSS | peak RSS increase |\n|---|---|---|---|---|---|---|")
    for m in ("naive", "ours"):
        s = summary[m]
        print(f"| {m} | {inter[m]['tokens_per_s']:.1f} | {inter[m]['tokens_per_cpu_s']:.1f} | "
              f"{s['tokens_per_s']:.1f} | {s['bytes_per_token']:.0f} | {s['max_rss_mb']:.0f} MiB | "
              f"{s['rss_increase_mb']:.0f} MiB |")
    print(f"\nspeed-up ours/naive: {ratio:.2f}x interleaved wall-clock, {cpu_ratio:.2f}x per CPU-second; "
          f"{isolated_ratio:.2f}x isolated (per round: "
          + ", ".join(f"{o['tokens_per_s'] / n['tokens_per_s']:.2f}x"
                      for n, o in zip(runs["naive"], runs["ours"], strict=True))
          + ")")
    if args.json:
        from benchmarks._results import command_line
        from engine.provenance import provenance

        Path(args.json).write_text(json.dumps({**provenance("bf16", command=command_line("bench_extract.py", None)),
                                               "rows": stats, "interleaved": inter, "runs": runs, "median": summary,
                                               "ratio": ratio, "cpu_ratio": cpu_ratio,
                                               "isolated_ratio": isolated_ratio}, indent=2))


if __name__ == "__main__":
    main()
