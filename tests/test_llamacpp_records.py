"""The llama.cpp figures in BENCHMARKS.md, its dated history and the shipped cards are the committed records', as
generated, and say what the records hold: identical answers, one acceptance across engines, each forecast's error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.recipes.model_card import ENGINES_BEGIN, ENGINES_END, engines_section, engines_table

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "docs" / "benchmarks-history.md"  # the llama.cpp chapter as written, prose and tables
ENGINES = "benchmarks/results/llamacpp/engines-amd-epyc-avx512bf16.json"
DSPARK = "benchmarks/results/llamacpp/engines-dspark-amd-epyc-avx512bf16.json"
SHIPPED = sorted((ROOT / "assets" / "drafts").glob("smollm2-135m-instruct-*"))
FORECAST_TOLERANCE = 0.1  # the bar: within 0.1x of the measured speedup
TAU_TOLERANCE = 0.05  # one acceptance: each engine within 0.05 of the evaluator on the same weights


def _record(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _between(text: str, begin: str, end: str) -> list[str]:
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n").splitlines()


@pytest.mark.parametrize("doc", ["history", "current"])
def test_the_benchmarks_table_is_the_records(doc):
    """The history's llama.cpp chapter names both records and holds their table; BENCHMARKS.md's generated block too."""
    if doc == "history":
        section = _section()
        table = _between(section, "<!-- engines-table -->", "<!-- /engines-table -->")
    else:
        section = "\n".join(_between((ROOT / "BENCHMARKS.md").read_text(), "<!-- table:engines -->",
                                      "<!-- /table:engines -->"))
        table = section.splitlines()
    for path in (ENGINES, DSPARK):  # the generated block names its records under benchmarks/results/
        assert (path if doc == "history" else f"`{path.removeprefix('benchmarks/results/')}`") in section
    rows = _record(ENGINES)["rows"] + _record(DSPARK)["rows"]
    assert [line for line in table if line.startswith("|")] == engines_table(rows, with_draft=True)


@pytest.mark.parametrize("card", SHIPPED, ids=[c.name for c in SHIPPED])
def test_each_shipped_card_shows_its_rows_of_the_record(card):
    record = _record(ENGINES)
    text = (card / "README.md").read_text()
    expected = "\n".join(engines_section(record, str(card), ENGINES))
    assert ENGINES_BEGIN in text and ENGINES_END in text
    shown = ENGINES_BEGIN + text.split(ENGINES_BEGIN, 1)[1].split(ENGINES_END, 1)[0] + ENGINES_END
    assert shown == expected.split(ENGINES_END, 1)[0] + ENGINES_END


def test_every_engine_accepts_as_the_evaluator_and_in_process_decodes_the_baseline():
    for row in _record(ENGINES)["rows"]:
        where = (Path(row["draft"]).name, row["workload"])
        assert row["in_process"]["identical"], where  # llama.cpp's answers: test_every_llama_cpp_divergence_...
        assert abs(row["llama_cpp"]["tau"] - row["evaluate"]["fp32"]) <= TAU_TOLERANCE, where
        assert abs(row["in_process"]["tau"] - row["evaluate"]["auto"]) <= TAU_TOLERANCE, where
    dspark = _record(DSPARK)["rows"][0]  # its own confidence cut stops it in-process: scored with every draft verified
    every = _record("benchmarks/results/llamacpp/evaluate-dspark-all-drafts-amd-epyc-avx512bf16.json")
    assert every["all_drafts"] and dspark["in_process"]["identical"] and dspark["in_process"]["tau"] is None
    assert abs(dspark["llama_cpp"]["tau"] - every["by_k"]["3"]["mean_acceptance_length"]) <= TAU_TOLERANCE


def _section() -> str:
    return HISTORY.read_text().split("## llama.cpp", 1)[1].split("\n## ", 1)[0]


def test_the_prose_figures_are_the_records():
    rows, text = _record(ENGINES)["rows"], " ".join(_section().split())
    lc = [r["llama_cpp"] for r in rows]
    assert f"within {max(abs(r['llama_cpp']['tau'] - r['evaluate']['fp32']) for r in rows):.3f} of the evaluator's" \
        in text
    assert f"within {max(abs(r['in_process']['tau'] - r['evaluate']['auto']) for r in rows):.3f} of the" in text
    assert f"differ by up to {max(abs(r['evaluate']['auto'] - r['evaluate']['fp32']) for r in rows):.3f}" in text
    assert f"{min(x['speedup'] for x in lc):.2f}–{max(x['speedup'] for x in lc):.2f}× (n-gram: " \
           f"{min(x['ngram']['speedup'] for x in lc):.2f}–{max(x['ngram']['speedup'] for x in lc):.2f}×)" in text
    assert f"costs {min(x['step_cost'] for x in lc):.2f}–{max(x['step_cost'] for x in lc):.2f} baseline tokens" in text
    for engine in ("llama_cpp", "in_process"):
        misses = [r for r in rows if abs(r[engine]["forecast_error"]) > FORECAST_TOLERANCE]
        assert f"within 0.1× of its measurement in {len(rows) - len(misses)} of {len(rows)}" in text or \
            f"within 0.1× in {len(rows) - len(misses)} of {len(rows)}" in text
        for r in misses:
            assert f"{r[engine]['forecast_error']:+.3f}×".replace("-", "−") in text or \
                f"{abs(r[engine]['forecast_error']):.3f}×" in text
    dspark = _record("benchmarks/results/llamacpp/evaluate-dspark-all-drafts-amd-epyc-avx512bf16.json")
    assert f"gives {dspark['by_k']['3']['mean_acceptance_length']:.3f} against llama.cpp's " \
           f"{_record(DSPARK)['rows'][0]['llama_cpp']['tau']:.3f}" in text


def test_every_llama_cpp_divergence_is_at_a_near_tie():
    """Where a llama.cpp answer leaves the baseline's (prompt, token), the record of those gaps holds it, and the
    target's two likeliest tokens are within 0.01 nats there."""
    gaps = _record("benchmarks/results/llamacpp/eagle3-general-target-f32-draft-q8_0-amd-epyc-avx512bf16.json")
    known = {}
    for name, method in gaps["methods"].items():
        if name == "baseline":
            continue
        for i, (pos, gap) in enumerate(zip(method["first_divergence"], method["divergence_gaps"], strict=True)):
            if pos is not None:
                known[(i, pos)] = gap
    assert known and all(gap is not None and abs(gap) < 0.01 for gap in known.values())
    for path in (ENGINES, DSPARK):
        for row in _record(path)["rows"]:
            if row["workload"] != "general":
                assert row["llama_cpp"]["identical"], row["workload"]
                continue
            for i, pos in enumerate(row["llama_cpp"]["first_divergence"]):
                assert pos is None or (i, pos) in known, (row["draft"], i, pos)


@pytest.mark.parametrize("target, draft", [("shipped", "f32"), ("shipped", "q8_0"), ("f32", "q8_0")])
def test_the_quantized_target_table_is_its_records(target, draft):
    path = f"llamacpp/eagle3-general-target-{target}-draft-{draft}-amd-epyc-avx512bf16.json"
    m = _record(f"benchmarks/results/{path}")["methods"]
    name = {"shipped": "Q4_1", "f32": "F32"}[target]
    line = (f"| {name} | {draft.upper()} | {m['baseline']['tokens_per_s']:.1f} | {m['draft']['speedup']:.2f}× | "
            f"{m['ngram']['speedup']:.2f}× | {m['draft_ngram']['speedup']:.2f}× | `{path}` |")
    assert line in _section()
