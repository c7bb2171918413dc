"""The llama.cpp figures in BENCHMARKS.md and the shipped cards are the committed records', as generated, and say
what the records hold: identical answers, one acceptance across engines, and each forecast's error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.recipes.model_card import ENGINES_BEGIN, ENGINES_END, engines_section, engines_table

ROOT = Path(__file__).resolve().parents[1]
ENGINES = "benchmarks/results/llamacpp/engines-amd-epyc-avx512bf16.json"
DSPARK = "benchmarks/results/llamacpp/engines-dspark-amd-epyc-avx512bf16.json"
SHIPPED = sorted((ROOT / "assets" / "drafts").glob("smollm2-135m-instruct-*"))
FORECAST_TOLERANCE = 0.1  # the bar: within 0.1x of the measured speedup
TAU_TOLERANCE = 0.05  # one acceptance: each engine within 0.05 of the evaluator on the same weights


def _record(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _between(text: str, begin: str, end: str) -> list[str]:
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n").splitlines()


def test_the_benchmarks_table_is_the_records():
    doc = (ROOT / "BENCHMARKS.md").read_text()
    section = doc.split("## llama.cpp", 1)[1].split("\n## ", 1)[0]
    for path in (ENGINES, DSPARK):
        assert path in section
    rows = _record(ENGINES)["rows"] + _record(DSPARK)["rows"]
    table = [line for line in _between(section, "<!-- engines-table -->", "<!-- /engines-table -->") if line]
    assert table == engines_table(rows, with_draft=True)


@pytest.mark.parametrize("card", SHIPPED, ids=[c.name for c in SHIPPED])
def test_each_shipped_card_shows_its_rows_of_the_record(card):
    record = _record(ENGINES)
    text = (card / "README.md").read_text()
    expected = "\n".join(engines_section(record, str(card), ENGINES))
    assert ENGINES_BEGIN in text and ENGINES_END in text
    shown = ENGINES_BEGIN + text.split(ENGINES_BEGIN, 1)[1].split(ENGINES_END, 1)[0] + ENGINES_END
    assert shown == expected.split(ENGINES_END, 1)[0] + ENGINES_END


@pytest.mark.parametrize("path", [ENGINES, DSPARK])
def test_every_engine_decodes_the_baseline_and_accepts_as_the_evaluator(path):
    for row in _record(path)["rows"]:
        where = (Path(row["draft"]).name, row["workload"])
        assert row["llama_cpp"]["identical"] and row["in_process"]["identical"], where
        assert abs(row["llama_cpp"]["tau"] - row["evaluate"]["fp32"]) <= TAU_TOLERANCE, where
        assert abs(row["in_process"]["tau"] - row["evaluate"]["auto"]) <= TAU_TOLERANCE, where
