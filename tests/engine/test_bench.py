"""The bench: every method on the same prompts, the JSON schema the app plots, transformers' own modes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.algos.eagle3.args import Eagle3Args
from engine.data.prompts.load import load_prompts
from engine.measure.bench import markdown_table, run_bench
from engine.measure.options import BenchOptions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_draft_dir(tiny_llama, tmp_path_factory):
    import torch

    from engine.algos.eagle3.io import build_eagle3, save_eagle3

    draft = build_eagle3(tiny_llama, Eagle3Args(draft_vocab_size=128), token_counts=torch.arange(tiny_llama.vocab_size),
                         aux_layer_ids=[1, 2, 3])
    return save_eagle3(draft, tmp_path_factory.mktemp("d") / "draft", dtype=torch.float32)


def test_all_methods_on_the_same_prompts(tiny_llama, tiny_targets, tiny_draft_dir, tmp_path):
    prompts = [{"prompt": "1 2 3 4 5 6 7 8 9 10, the numbers go on and on"},
               {"messages": [{"role": "user", "content": "hello there, how are you"}]}]
    result = run_bench(tiny_llama, prompts,
                       BenchOptions(methods=("baseline", "draft", "ngram", "hf_prompt_lookup", "hf_assisted"),
                                    draft=str(tiny_draft_dir), assistant=str(tiny_targets["qwen3"]), k=3,
                                    max_new_tokens=24), progress=False)
    methods = result["methods"]
    assert set(methods) == {"baseline", "draft", "ngram", "hf_prompt_lookup", "hf_assisted"}
    for name, row in methods.items():
        assert {"mean_acceptance_length", "per_position_acceptance", "tokens_per_s", "speedup",
                "identical_to_baseline"} <= set(row), name
        assert row["identical_to_baseline"], name  # greedy: every method is lossless
        assert row["tokens_per_s"] > 0
    assert methods["baseline"]["speedup"] == pytest.approx(1.0)
    assert methods["draft"]["mean_acceptance_length"] >= 1.0 and len(methods["draft"]["per_position_acceptance"]) == 3
    assert methods["hf_prompt_lookup"]["mean_acceptance_length"] is None  # transformers does not report it
    assert "2" in result["cost_curve"] or "4" in result["cost_curve"]
    assert "| draft |" in markdown_table(result)
    # per prompt: small rows the Benchmarks page drills into
    assert [len(methods[m]["per_prompt"]) for m in ("baseline", "draft", "hf_prompt_lookup")] == [2, 2, 2]
    assert methods["draft"]["per_prompt"][0]["mean_acceptance_length"] >= 1.0
    assert sum(r["tokens"] for r in methods["draft"]["per_prompt"]) == methods["draft"]["tokens"]
    assert result["prompt_previews"] == ["1 2 3 4 5 6 7 8 9 10, the numbers go on and on", "hello there, how are you"]
    json.dumps(result)  # serialisable for the app


def test_bench_cli_writes_json_and_skips_unfit_assistant(tiny_targets, tiny_draft_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "engine", "bench", "--target", str(tiny_targets["llama"]),
                           "--draft", str(tiny_draft_dir), "--prompts", str(prompts), "--max-new-tokens", "12",
                           "--methods", "baseline,draft,hf_assisted", "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["methods"]["hf_assisted"]["skipped"]
    from engine.cli import build_parser
    from engine.cpu import cpu_identity
    from engine.provenance import FIELDS

    assert all(data[f] for f in FIELDS)  # the record names its command, machine (model and kind), dtype, day, torch
    assert {k: data[k] for k in ("cpu", "cpu_kind")} == cpu_identity() and len(data["date"]) == 10
    assert data["dtype"] == data["target_dtype"] and data["torch"] == __import__("torch").__version__
    again = vars(build_parser().parse_args(data["command"].split()[3:]))  # the command runs the same bench
    assert again["target"] == str(tiny_targets["llama"]) and again["methods"] == "baseline,draft,hf_assisted"
    assert again["max_new_tokens"] == 12 and again["json_out"] is None
    assert data["methods"]["draft"]["identical_to_baseline"] is True
    from engine.format.checkpoint import weights_sha256

    assert data["draft_sha256"] == weights_sha256(tiny_draft_dir)  # and the weights it measured


def test_prompt_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    with pytest.raises(Exception, match="line 2 needs a 'prompt' or 'messages' key"):
        load_prompts(str(bad))


def test_a_bench_job_reports_prompts_done_and_time_left(tiny_llama, tmp_path, monkeypatch):
    from engine import jobs

    monkeypatch.setenv(jobs.JOB_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(jobs, "_REPORTER", None)
    seen = []
    real = jobs.Reporter.update

    def spy(self, message=None, progress=None, **result):
        seen.append((message, progress))
        real(self, message, progress, **result)

    monkeypatch.setattr(jobs.Reporter, "update", spy)
    prompts = [{"prompt": f"Count to {i}."} for i in range(3)]
    run_bench(tiny_llama, prompts, BenchOptions(methods=("baseline", "ngram"), max_new_tokens=4), measure_cost=False,
              span=(0.0, 1.0))
    assert [p for _, p in seen] == sorted(p for _, p in seen)  # progress only grows
    assert seen[-1] == ("prompts benchmarked (every method): 3/3 " + seen[-1][0].split("3/3 ")[1], 1.0)
    assert seen[0] == ("prompts benchmarked (every method): 0/3", 0.0)  # at most every second in between


def test_the_speedup_ceiling_counts_the_steps_that_drafted_nothing():
    """Issue 65: n-gram drafting on 1 step of 10 has its ceiling from 1.2 tokens per step, not its acceptance 3."""
    from types import SimpleNamespace

    import torch

    from engine.generate.events import StepEvent
    from engine.generate.sampling import SamplingParams
    from engine.measure.bench import MethodRun, summarize

    run = MethodRun("ngram", seconds=1.0, steps=11)
    run.metrics.observe(StepEvent(step=0, tokens=[1], sources=["target"], elapsed_s=0.1))
    run.metrics.observe(StepEvent(step=1, tokens=[1, 1, 1], sources=["accepted"] * 3, drafted=3, accepted=2))
    for i in range(9):
        run.metrics.observe(StepEvent(step=2 + i, tokens=[1], sources=["target"]))
    target = SimpleNamespace(ref=SimpleNamespace(name="t"), dtype=torch.float32, extra={}, device=torch.device("cpu"))
    result = summarize({"ngram": run}, k=3, params=SamplingParams(max_new_tokens=12), cost_curve={1: 1.0, 4: 1.5},
                       num_prompts=1, target=target, draft=None)
    row = result["methods"]["ngram"]
    assert row["mean_acceptance_length"] == 3.0
    assert abs(row["speedup_ceiling"] - 12 / (1.5 + 9)) < 1e-9   # not 3.0 / 1.5 = 2.0
