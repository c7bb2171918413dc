"""BENCHMARKS.md is its generator's output: every table is what the committed records give, the file stays short, and
a figure edited by hand or a record measured again without regenerating fails."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402

MAX_WORDS = 5000


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A copy of benchmarks/results/ the generator reads instead (its cache emptied before and after)."""
    copy = tmp_path / "results"
    shutil.copytree(report.RESULTS, copy)
    monkeypatch.setattr(report, "RESULTS", copy)
    report.load.cache_clear()
    yield copy
    report.load.cache_clear()


def test_every_table_of_benchmarks_md_is_what_the_records_give():
    text = report.DOC.read_text()
    written = report.blocks(text)
    assert set(written) == set(report.TABLES)  # every table is in the file, and nothing else between markers
    for name in report.TABLES:
        assert written[name] == report.render(name), f"{name}: run python benchmarks/report.py --write"
        assert "| " in written[name] or name == "gpu"
    assert report.check() == []


def test_benchmarks_md_is_short_and_names_each_records_provenance():
    text = report.DOC.read_text()
    assert len(text.split()) <= MAX_WORDS, len(text.split())
    for name, block in report.blocks(text).items():  # each table's records: CPU, dtype, day and command
        for path in re.findall(r"^- `([^`]+\.json)`: ", block, flags=re.M):
            assert f"`{report.need(path, 'command')}`" in block and report.day(path) in block, (name, path)
        cells = [c for line in block.splitlines() if line.startswith("|") for c in line.strip("|").split(" | ")]
        assert not [c for c in cells if len(c.split()) > 40], name  # a table cell is one line
    assert "docs/benchmarks-history.md" in text


def test_a_figure_edited_by_hand_fails_the_check(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    text = report.DOC.read_text()
    block = report.blocks(text)["train-speed"]
    edited = re.sub(r"\| (\d+\.\d\d)× \|", lambda m: f"| {float(m[1]) + 0.01:.2f}× |", block, count=1)
    assert edited != block
    doc.write_text(text.replace(block, edited))
    assert report.check(doc) == ["train-speed"]
    assert report.main(["--check", "--doc", str(doc)]) == 1
    report.write(doc)  # regenerating restores it
    assert doc.read_text() == text and report.main(["--check", "--doc", str(doc)]) == 0


def test_a_record_measured_again_without_regenerating_fails_the_check(results):
    path = results / "attribution" / "amd-epyc-zen4.json"
    record = json.loads(path.read_text())
    record["rows"][0]["tau"] += 0.01
    path.write_text(json.dumps(record))
    assert report.check() == ["tau-protocols"]


def test_a_record_without_a_field_a_table_reads_names_the_record_and_the_field(results):
    path = results / "train_quality" / "amd-epyc-zen4-dflash2.json"
    record = json.loads(path.read_text())
    del record["results"]["dflash2"]["speculators"]["speed"]
    path.write_text(json.dumps(record))
    with pytest.raises(report.RecordError, match=r"train_quality/amd-epyc-zen4-dflash2\.json: no field "
                                                 r"results\.dflash2\.speculators\.speed$"):
        report.render("train-speed")
    record = json.loads((report.ROOT / "benchmarks" / "results" / path.relative_to(results)).read_text())
    del record["date"]
    path.write_text(json.dumps(record))
    report.load.cache_clear()
    with pytest.raises(report.RecordError, match=r"train_quality/amd-epyc-zen4-dflash2\.json: no field date$"):
        report.render("train-speed")


def test_two_newest_records_on_one_day_are_refused_not_guessed(results):
    first = "reship-eagle3/amd-epyc-zen4-2026-12-04/vllm_bench.json"
    second = results / "reship-eagle3" / "amd-epyc-zen4-copy" / "vllm_bench.json"
    second.parent.mkdir()
    shutil.copy(results / first, second)
    with pytest.raises(report.RecordError, match="two newest records on AVX-512 BF16"):
        report.render("shipped-drafts")
    assert len(report.newest(report.found(report.SHIPPED_VLLM["eagle3"]), ties=True)) == 2


def test_the_training_records_are_all_listed_oldest_first():
    """Same-day training records are ordered by hand in TRAIN_QUALITY: every one is there, and no day goes back."""
    runs = {str(p.relative_to(report.RESULTS)) for p in (report.RESULTS / "train_quality").glob("*.json")
            if "results" in json.loads(p.read_text())}
    assert set(report.TRAIN_QUALITY) == runs
    days = [re.findall(r"\d{4}-\d{2}-\d{2}", report.day(p))[0] for p in report.TRAIN_QUALITY]
    by_kind: dict[str, list[str]] = {}
    for path, d in zip(report.TRAIN_QUALITY, days, strict=True):
        by_kind.setdefault(report.kind(path), []).append(d)
    assert all(d == sorted(d) for d in by_kind.values())


def test_the_levers_prose_is_its_record():
    """The step-cost arithmetic under the levers table: each figure computed from the newest levers record."""
    path = report.newest(report.found(report.LEVERS))[0]
    general, chat = (report.load(path)["workloads"][w] for w in ("general", "sharegpt"))
    costs = general["costs"]
    step = costs["verify_cost"]["3"] + costs["draft_cost"]["3"]

    def per_step(w, method, k):
        return next(r["tokens_per_step"] for r in w["forecasts"] if r["method"] == method and not r["p_min"]
                    and r["k"] == k and r.get("ngram_min_match") in (None, 2))

    cut_slower = all(max(r["forecast_speedup"] for r in w["forecasts"] if r["p_min"] and r["method"] == m)
                     < max(r["forecast_speedup"] for r in w["forecasts"] if not r["p_min"] and r["method"] == m)
                     for w in (general, chat) for m in ("draft", "draft_ngram"))
    best_k = max((r for r in general["forecasts"] if r["method"] == "draft_ngram" and not r["p_min"]),
                 key=lambda r: r["forecast_speedup"])["k"]
    hybrid = next(d for name, d in chat["decoded"].items() if d.get("method") == "draft_ngram" and not d["p_min"])
    section = report.DOC.read_text().split("## What each lever buys", 1)[1].split("\n## ", 1)[0]
    said = [f"({costs['verify_cost']['3']:.2f} at k = 3 here)", f"({costs['draft_cost']['3']:.2f} of a step at k = 3)",
            f"At {step:.2f} baseline steps per k = 3 step, 1.3× needs {1.3 * step:.2f} tokens per step",
            f"the draft gives {per_step(general, 'draft', 3):.2f}",
            f"`draft_ngram` {per_step(general, 'draft_ngram', best_k):.2f} (at its best k, {best_k})",
            f"`draft_ngram` reaches {hybrid['speedup']:.2f}×",
            f"n-gram alone ({chat['decoded']['ngram']['speedup']:.2f}×)"]
    plain = next(p for p in report.newest(report.found(report.LEVERS_LLAMACPP), ties=True)
                 if not report.load(p)["p_min"])
    draft = report.load(plain)["methods"]["draft"]
    cost = draft["mean_acceptance_length"] / draft["speedup"]  # every step drafts k: tokens per step is τ
    said.append(f"a k = 3 step costs {cost:.2f} baseline tokens (τ {draft['mean_acceptance_length']:.2f} at "
                f"{draft['speedup']:.2f}×): 1.3× would need {1.3 * cost:.2f} tokens per step")
    for words in said:
        assert words in section, words
    assert cut_slower  # "every p-min ... forecasts slower than no cut on both workloads"
    cut = [report.load(p)["methods"]["draft"]["speedup"] for p in report.found(report.LEVERS_LLAMACPP)
           if report.load(p)["p_min"]]
    assert all(draft["speedup"] < c < 1.0 for c in cut)  # "the cut pays there, though not past the target alone"
