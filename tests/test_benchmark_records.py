"""Every figure of a checked table in the dated history (docs/benchmarks-history.md) equals the committed record
beside it, as displayed; every record under benchmarks/results names its provenance."""

# Each checked table names its record (`benchmarks/results/<bench>/...`); the record names the command that made
# it, the CPU and the dtype, and the table's section names the same CPU and dtype. A figure edited by hand, or a
# record re-measured without regenerating the table, fails here. Every record (the whole tree) names its command,
# CPU model and kind (AMX, AVX-512 BF16, AVX2: the kind agrees with the machine its path names), dtype, date and
# torch.

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks-history.md"  # BENCHMARKS.md: tests/test_benchmark_report.py
RESULTS = ROOT / "benchmarks" / "results"
# the shipped EAGLE-3 draft measured again on its shipped files, one speed per k (its card quotes these records)
CARD_EAGLE3 = "reship-eagle3/amd-epyc-zen4-2026-12-04"


def _dash(fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    return lambda v: "–" if v is None or v == [] else fmt(v)


# How a table shows a record field, by column header.
COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "k": ("k", _dash(str)),
    "mean acceptance length": ("mean_acceptance_length", _dash(lambda v: f"{v:.2f}")),
    "per-position acceptance": ("per_position_acceptance", _dash(lambda v: ", ".join(f"{x:.2f}" for x in v))),
    "draft ms / step": ("draft_ms_per_step", _dash(lambda v: f"{v:.1f}")),
    "draft / target step": ("draft_fraction_of_target_step", _dash(lambda v: f"{v:.2f}")),
    "tokens/s": ("tokens_per_s", lambda v: f"{v:.1f}"),
    "speedup": ("speedup", lambda v: f"{v:.2f}×"),
    "vs fp32 baseline": ("speedup_vs_fp32_baseline", lambda v: f"{v:.2f}×"),
    "identical": ("identical_to_baseline", lambda v: "yes" if v else "no"),
    "identical to baseline": ("identical_to_baseline", lambda v: "yes" if v else "no"),
    "server start": ("server_start_s", lambda v: f"{int(v + 0.5)} s"),  # rounded half up, as written
}


def _first_word(cell: str) -> str:
    return cell.split()[0]


def _vllm_builtin(cell: str) -> str:
    return "baseline" if cell == "vLLM alone" else ("draft" if "draft" in cell else "ngram")


# (section heading or the sentence right before the table, record, where its methods are, row cell -> method key)
TABLES = [
    ("## Speculative decoding in-process: shipped draft", "inprocess_builtin.json", (), _first_word),
    ("## Real vLLM (CPU build)", "vllm_builtin.json", (), _vllm_builtin),
    ("### In-process", "drafters/builtin.json", ("inprocess",), str),
    ("### Real vLLM", "drafters/builtin.json", ("vllm",), str),
    ("End to end, the same 20 held-out prompts", "drafters/builtin-dtypes.json", ("inprocess",), str),
    ("The shipped EAGLE-3 draft in-process on this Xeon", "remeasure-eagle3/intel-xeon-amx/bench.json", (),
     _first_word),
    ("The shipped EAGLE-3 draft in-process on this AMD EPYC", "remeasure-eagle3/bench.json", (), _first_word),
    ("The re-shipped EAGLE-3 draft in-process", "reship-eagle3/amd-epyc-zen4/bench.json", (), _first_word),
    ("The re-shipped EAGLE-3 draft in real vLLM", "reship-eagle3/amd-epyc-zen4/vllm_bench.json", (), _first_word),
    ("The re-shipped DFlash draft in-process", "reship-dflash/amd-epyc-zen4/bench.json", (), _first_word),
    ("The re-shipped DFlash draft in real vLLM", "reship-dflash/amd-epyc-zen4/vllm_bench.json", (), _first_word),
    ("The three shipped drafts in one in-process run", "dflash2-recipe/amd-epyc-zen4/drafters.json", ("inprocess",),
     str),
    ("The recipe's own bench of the DFlash2 draft", "dflash2-recipe/amd-epyc-zen4/bench.json", (), _first_word),
]


def _section(text: str, start: str) -> str:
    """From `start` to the next heading of any level."""
    i = text.index(start)
    nxt = re.search(r"^#{2,3} ", text[i + len(start):], flags=re.M)
    return text[i: i + len(start) + (nxt.start() if nxt else len(text))]


def _chapter(text: str, start: str) -> str:
    """The `## ` chapter that holds `start` (its sub-sections included)."""
    i = text.index(start)
    head = i if start.startswith("## ") else text.rfind("\n## ", 0, i) + 1
    nxt = text.find("\n## ", i + 1)
    return text[head: nxt if nxt >= 0 else len(text)]


def _table(section: str) -> list[dict[str, str]]:
    """The first markdown table in `section`, one dict per row (bold marks dropped)."""
    all_lines = section.splitlines()
    start = next(i for i, x in enumerate(all_lines) if x.startswith("|"))
    lines = []
    for x in all_lines[start:]:
        if not x.startswith("|"):
            break
        lines.append(x)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip().replace("**", "") for c in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]


def _record(path: str) -> dict[str, Any]:
    return json.loads((RESULTS / path).read_text())


@pytest.mark.parametrize("start,path,where,key", TABLES, ids=[t[1] + ":" + t[0][:24] for t in TABLES])
def test_each_figure_of_a_checked_table_is_its_records(start, path, where, key):
    section = _section(DOC.read_text(), start)
    assert f"benchmarks/results/{path}" in section, "the section names its record"
    record = _record(path)
    methods = record
    for part in where:
        methods = methods[part]
    methods = methods["methods"]
    rows = _table(section)
    assert rows
    checked = 0
    for row in rows:
        first = next(iter(row.values()))
        values = methods[key(first)]
        for column, cell in row.items():
            if column in COLUMNS:
                field, show = COLUMNS[column]
                assert cell == show(values[field]), (path, first, column)
                checked += 1
    assert checked >= 3 * len(rows)


def test_step_cost_table_is_its_record():
    section = _section(DOC.read_text(), "## In-process step cost")
    assert "benchmarks/results/step_cost/builtin.json" in section
    record = _record("step_cost/builtin.json")
    rows = _table(section.split("One target forward over n new tokens")[1])
    assert [r["target"] for r in rows] == list(record["ms"])
    for row in rows:
        name = row["target"]
        for n in record["ms"][name]:
            own, fp32 = record["relative_to_own_step"][name][n], record["relative_to_fp32_step"][name][n]
            assert row[f"{n} token{'s' if n != '1' else ''}"] == (
                f"{record['ms'][name][n]:.1f} ms ({own:.2f}× own, {fp32:.2f}× fp32)"), (name, n)


CHECKED_RECORDS = sorted({t[1] for t in TABLES} | {"step_cost/builtin.json"})


@pytest.mark.parametrize("path", CHECKED_RECORDS)
def test_each_checked_record_names_its_command_cpu_and_dtype(path):
    record = _record(path)
    assert record["command"].startswith("python "), path
    assert record["cpu"], path
    dtypes = record.get("dtypes") or [record.get("dtype") or record.get("target_dtype")]
    assert all(dtypes), path
    sections = [_chapter(DOC.read_text(), t[0]) for t in TABLES if t[1] == path] or [
        _section(DOC.read_text(), "## In-process step cost")]
    cpu = next((c for c in ("AMD EPYC", "Intel Xeon") if c.split()[1] in record["cpu"]), record["cpu"])
    for text in sections:  # the table's own section says on what it was measured
        assert cpu in text, (path, cpu)
        assert all(d in text or {"fp32": "float32", "bf16": "bfloat16"}.get(d, d) in text
                   or {"float32": "fp32", "bfloat16": "bf16"}.get(d, d) in text for d in dtypes), (path, dtypes)


# Files under benchmarks/results that are not measurements: a recipe's data manifest, copied beside its records
# (its provenance is the extract step's marker, recipe/steps/extract.json, which is checked).
NOT_RECORDS = ("hidden-manifest.json",)
# The machines a path names (a folder, or a file named after its machine) and their CPU kinds.
MACHINES = {"amd-epyc-zen4": "AVX-512 BF16", "amd-epyc-avx2": "AVX2", "intel-xeon-amx": "AMX"}
UNKNOWN = re.compile(r"unknown \(.+\)", re.DOTALL)  # "unknown (why)": only in records filled in after the fact


def _all_records() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*.json") if p.name not in NOT_RECORDS)


def _named_machine(path: Path) -> str | None:
    names = [m for part in path.relative_to(RESULTS).parts for m in MACHINES if part.startswith(m)]
    assert len(set(names)) <= 1, f"{path} names two machines"
    return names[0] if names else None


def check_provenance(path: Path) -> None:
    """The record names its command, CPU (model and kind), dtype, date and torch; "unknown (why)" only where the
    fields were added after the fact (`provenance_added`); the kind agrees with the machine its path names."""
    from engine.cpu import CPU_KINDS, kind_named
    from engine.provenance import FIELDS

    record = json.loads(path.read_text())
    assert isinstance(record, dict), f"{path}: a record is an object (rows go under 'rows')"
    late = record.get("provenance_added")
    if late:
        assert re.match(r"\d{4}-\d{2}-\d{2}: ", late), f"{path}: provenance_added starts with the day it was added"
    for field in FIELDS:
        value = record.get(field) or (record.get("dtypes") if field == "dtype" else None)
        assert value, f"{path}: no {field}"
        if isinstance(value, str) and value.startswith("unknown"):
            assert late and UNKNOWN.fullmatch(value), f"{path}: {field} '{value}' (unknown only as 'unknown (why)', " \
                "in a record that predates its writer's provenance and says so in provenance_added)"
    known = {f: record[f] for f in FIELDS if f in record and not str(record[f]).startswith("unknown")}
    if "command" in known:
        assert re.match(r"(\.venv/bin/)?python ", known["command"]), f"{path}: command {known['command']!r}"
    if "date" in known:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", known["date"]), f"{path}: date {known['date']!r}"
    if "torch" in known:
        assert re.match(r"\d+\.\d+", known["torch"]), f"{path}: torch {known['torch']!r}"
    kind = known.get("cpu_kind")
    assert kind is None or kind in CPU_KINDS, f"{path}: cpu_kind {kind!r} is not one of {CPU_KINDS}"
    machine = _named_machine(path)
    if machine:
        assert kind == MACHINES[machine], f"{path}: cpu_kind {kind!r}, but its path names {machine}"
    named = kind_named(known.get("cpu"))
    assert named is None or named == kind, f"{path}: its cpu names {named}, its cpu_kind is {kind!r}"


@pytest.mark.parametrize("path", _all_records(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_record_names_its_command_cpu_kind_dtype_date_and_torch(path):
    check_provenance(path)


def test_the_provenance_check_fails_on_a_missing_field_and_on_a_kind_not_the_folders(tmp_path, monkeypatch):
    """The check above can fail: a record without its torch, an AVX2 kind in a Zen 4 folder, an 'unknown' in a
    record that does not say it was filled in after the fact."""
    record = json.loads((RESULTS / "reship-eagle3" / "amd-epyc-zen4" / "bench.json").read_text())
    folder = tmp_path / "results" / "x" / "amd-epyc-zen4"
    folder.mkdir(parents=True)
    monkeypatch.setattr(sys.modules[__name__], "RESULTS", tmp_path / "results")
    path = folder / "bench.json"
    path.write_text(json.dumps(record))
    check_provenance(path)
    for broken, message in (({"torch": None}, "no torch"), ({"cpu_kind": "AVX2"}, "its path names amd-epyc-zen4"),
                            ({"provenance_added": None, "date": "unknown (x)"}, "unknown only as"),
                            ({"cpu_kind": "Zen 4"}, "is not one of")):
        path.write_text(json.dumps({**record, **broken}))
        with pytest.raises(AssertionError, match=re.escape(message)):
            check_provenance(path)


def test_every_json_under_results_is_checked_or_named_as_no_record():
    """The walk covers the whole tree (rows of curves and sweeps included), leaving out only NOT_RECORDS."""
    every = sorted(RESULTS.rglob("*.json"))
    assert len(_all_records()) >= 55 and {p.name for p in every} - {p.name for p in _all_records()} <= set(NOT_RECORDS)
    assert {"sweep.json", "curve.json"} <= {p.name for p in _all_records()}


def test_eagle3_acceptance_per_k_and_against_data_are_its_evaluation_records():
    text = DOC.read_text()
    fp32, bf16 = _record("evaluate/shipped_eagle3.json"), _record("remeasure-eagle3/evaluate.json")
    assert bf16["target_dtype"] == "bf16"
    rows = _table(_section(text, "### How acceptance and speedup change with k"))
    for row in rows:
        k = row["k"]
        expected = f"{fp32['by_k'][k]['mean_acceptance_length']:.3f}" if k in fp32["by_k"] else "–"
        assert row["EAGLE-3 τ (fp32)"] == expected, k
    data = {r["draft"]: r for r in _table(_section(text, "### Acceptance against data"))}
    column = "decoding-exact τ at k = 3 (20 held-out prompts)"
    assert data["EAGLE-3"][column] == f"{fp32['by_k']['3']['mean_acceptance_length']:.3f}"
    assert data["EAGLE-3"]["target dtype"] == "fp32"
    assert data["EAGLE-3 (its card)"][column] == f"{bf16['by_k']['3']['mean_acceptance_length']:.3f}"
    assert data["EAGLE-3 (its card)"]["target dtype"] == "bf16"
    assert all(r["target dtype"] in ("fp32", "bf16") for r in data.values())  # every figure says its dtype


def _check_reship(text: str, section: str, folder: str, new: dict, old: dict, data_row: str, card: str,
                  card_folder: str | None = None) -> None:
    """A re-ship's section, data row and card against its records in `folder`: τ per k beside the replaced draft's
    (same CPU, dtype, prompts and length), the data and tokens seen, the card's figures (from `card_folder`'s records
    where the shipped draft was measured again since)."""
    assert new["cpu"] == old["cpu"] and new["target_dtype"] == old["target_dtype"] == "bf16"
    assert new["num_samples"] == old["num_samples"] == 20 and new["max_new_tokens"] == old["max_new_tokens"] == 128
    rows = _table(section.split("Decoding-exact acceptance per k")[1])
    assert [r["k"] for r in rows] == list(new["by_k"])
    for row in rows:
        k = row["k"]
        assert row["τ (this draft)"] == f"{new['by_k'][k]['mean_acceptance_length']:.3f}"
        assert row["τ (the draft it replaces)"] == f"{old['by_k'][k]['mean_acceptance_length']:.3f}"
        if "forecast speedup" in row:
            assert row["forecast speedup"] == f"{new['forecast']['by_k'][k]['speedup']:.2f}×"
    manifest = _record(f"{folder}/recipe/hidden-manifest.json")
    metrics = [json.loads(x) for x in (RESULTS / folder / "recipe" / "train-metrics.jsonl").open()]
    seen = sum(r.get("tokens", 0) for r in metrics if r["split"] == "train")
    assert f"{manifest['samples']:,} conversations" in section and f"{manifest['tokens']:,} tokens" in section
    assert f"{manifest['loss_tokens']:,} of them in the loss" in section and f"{seen:,.0f} tokens seen" in section
    row = {r["draft"]: r for r in _table(_section(text, "### Acceptance against data"))}[data_row]
    assert row["decoding-exact τ at k = 3 (20 held-out prompts)"] == f"{new['by_k']['3']['mean_acceptance_length']:.3f}"
    assert row["conversations"] == f"{manifest['samples']:,}"
    assert row["assistant tokens"] == f"{manifest['loss_tokens']:,}"
    card_text = (ROOT / "assets" / "drafts" / card / "README.md").read_text()
    bench = _record(f"{card_folder or folder}/bench.json")
    evaluated = _record(f"{card_folder}/evaluate.json") if card_folder else new
    assert f"Mean acceptance length **{bench['methods']['draft']['mean_acceptance_length']:.2f}**" in card_text
    assert f"| 3 | {evaluated['by_k']['3']['mean_acceptance_length']:.3f} |" in card_text


def test_the_reshipped_eagle3_drafts_figures_are_its_records():
    """Issue 31's re-ship: τ per k beside the draft it replaced, the data row, the figures the prose compares, and the
    shipped draft's card, all the committed records' (AMD EPYC Zen 4)."""
    text = DOC.read_text()
    section = _chapter(text, "## The re-shipped EAGLE-3 draft")
    folder = "reship-eagle3/amd-epyc-zen4"
    new, old = _record(f"{folder}/evaluate.json"), _record("remeasure-eagle3/evaluate.json")
    assert "forecast speedup" in _table(section.split("Decoding-exact acceptance per k")[1])[0]
    _check_reship(text, section, folder, new, old, "EAGLE-3 re-shipped (its card)", "smollm2-135m-instruct-eagle3",
                  card_folder=CARD_EAGLE3)
    first = _record(f"{folder}/recipe/vllm_bench.json")["methods"]["draft"]
    assert f"**{first['speedup']:.2f}×** ({first['tokens_per_s'] / first['speedup']:.1f} against " \
        f"{first['tokens_per_s']:.1f} tokens/s)" in section


def test_the_reshipped_dflash_drafts_figures_are_its_records():
    """Issue 31's DFlash re-ship on the EAGLE-3 draft's conversations: τ per k beside the draft it replaced (both
    evaluated on this machine with the same settings), the data row and the card, all the committed records'."""
    text = DOC.read_text()
    folder = "reship-dflash/amd-epyc-zen4"
    new, old = _record(f"{folder}/evaluate.json"), _record(f"{folder}/replaced-evaluate.json")
    assert new["draft_sha256"] != old["draft_sha256"] and list(new["by_k"]) == list(old["by_k"])  # two drafts
    _check_reship(text, _chapter(text, "## The re-shipped DFlash draft"), folder, new, old,
                  "DFlash re-shipped (its card)", "smollm2-135m-instruct-dflash")


def test_answer_store_table_is_its_record():
    """The re-evaluation figures (seconds, ratio, equality) are the record's, as displayed."""
    record = json.loads((RESULTS / "answer_store" / "amd-epyc-avx2.json").read_text())
    text = _section(DOC.read_text(), "Re-evaluation through the answer store")
    assert f"| first (the target answers {record['prompts']} prompts) | {record['first_s']:.1f} |" in text
    assert f"| second (answers read from the store) | {record['second_s']:.1f} |" in text
    assert f"Re-evaluation {record['speedup']:.1f}× faster" in text and record["figures_equal"]
    assert record["cpu"] in text and record["target_dtype"] in text and "bench_answer_store.py" in record["command"]


def _check_data_cost_rows(record: dict[str, Any], text: str) -> None:
    """The data-cost table's rows (each step, both ways, wall and CPU seconds per conversation) are the record's."""
    rows = {r["way"]: r for r in _table(text)}
    wall, cpu, parts = record["per_conversation_s"], record["per_conversation_cpu_s"], \
        record["two_steps_parts_per_conversation_s"]
    assert rows["regenerate (transformers generate)"]["s per conversation"] == f"{parts['regenerate']:.2f}"
    assert rows["extract (a second forward)"]["s per conversation"] == f"{parts['extract']:.2f}"
    for way, key in (("regenerate, then extract", "two_steps"), ("one pass (regenerate --extract-to)", "one_pass")):
        assert rows[way]["s per conversation"] == f"{wall[key]:.2f}", way
        assert rows[way]["CPU s per conversation"] == f"{cpu[key]:.2f}", way


def test_data_cost_table_is_its_record():
    """Seconds per conversation both ways, their ratio and the hidden-state differences are the record's."""
    record = _record("data_cost/intel-xeon-amx.json")
    text = _section(DOC.read_text(), "## Data cost per conversation")
    assert "benchmarks/results/data_cost/intel-xeon-amx.json" in text and "bench_onepass.py" in record["command"]
    assert "Intel Xeon (AMX)" in text and "Xeon" in record["cpu"] and record["dtype"] in text
    _check_data_cost_rows(record, text)
    assert f"one pass / two steps: **{record['ratio']:.2f}** (CPU seconds {record['cpu_ratio']:.2f})" in text
    out, exact = record["outputs"], record["exact_check"]
    assert out["rows_equal"] and out["tokens_equal"] and exact["rows_equal"] and exact["tokens_equal"]
    assert f"max |difference| {out['max_abs_diff']:.3g}" in text
    assert f"{100 * out['share_of_values_differing']:.2f}% of the values differ" in text
    assert f"{exact['dtype']} files of the first {exact['conversations']} conversations: max |difference| " \
           f"{exact['max_abs_diff']:.2g}" in text


@pytest.mark.parametrize("heading,slug,cpu_word", [("## Intel Xeon (AMX)", "intel-xeon-amx", "Xeon"),
                                                    ("## AMD EPYC Zen 4", "amd-epyc-zen4", "AMD EPYC")])
def test_per_cpu_step_cost_and_baseline_tables_are_their_records(heading, slug, cpu_word):
    """A CPU's chapter (the Intel Xeon with AMX, the AMD EPYC Zen 4): the step-cost and baseline-vs-generate tables
    are their records, as the scripts print them, and the chapter names the CPU and the kernel path the measurement
    chose."""
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_baseline_generate import markdown as baseline_markdown
    from benchmarks.bench_step_cost import markdown as step_markdown

    chapter = _chapter(DOC.read_text(), heading)
    step, baseline = _record(f"step_cost/{slug}.json"), _record(f"baseline_generate/{slug}.json")
    for name, record in (("step_cost", step), ("baseline_generate", baseline)):
        assert f"benchmarks/results/{name}/{slug}.json" in chapter and cpu_word in record["cpu"]
        assert record["command"] in chapter.replace(".venv/bin/python", "python")
    assert step_markdown(step) in chapter and baseline_markdown(baseline) in chapter
    assert baseline["kernel_paths"]["auto"] in chapter
    [auto] = [v for k, v in baseline["tokens_per_s"].items() if k.startswith("engine baseline (auto")]
    fastest = max(v for k, v in baseline["tokens_per_s"].items() if k.startswith("transformers"))
    assert (auto >= fastest) == ("is **met** here" in chapter)


def test_training_precision_table_is_its_record():
    """fp32 vs bf16 autocast training on a CPU: the table is the record as the script prints it, with its command."""
    import sys

    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_train_precision import table

    chapter = _chapter(DOC.read_text(), "## Training precision on a CPU")
    record = _record("train_precision/amd-epyc-zen4.json")
    assert "benchmarks/results/train_precision/amd-epyc-zen4.json" in chapter and "AMD EPYC" in record["cpu"]
    assert record["command"] in chapter.replace(".venv/bin/python", "python")
    assert table(record) in chapter


def test_training_outcome_table_is_its_record():
    """The four algorithms x two trainers (and ours under bf16) table is the record's, and names its command."""
    from benchmarks.bench_train_quality import table

    chapter = _chapter(DOC.read_text(), "## Training outcome: our trainers vs speculators 0.9.0's")
    record = _record("train_quality/amd-epyc-zen4.json")
    assert "benchmarks/results/train_quality/amd-epyc-zen4.json" in chapter and "AMD EPYC" in record["cpu"]
    assert record["command"] in chapter.replace(".venv/bin/python", "python")
    assert table(record["results"]) in chapter
    assert set(record["results"]) == {"eagle3", "dflash", "peagle", "dspark"}


@pytest.mark.parametrize("name", ["amd-epyc-zen4-dspark-batched-heads", "amd-epyc-zen4-dspark-same-objective"])
def test_dspark_reruns_are_their_records(name):
    """The DSpark re-runs (heads for all slots at once; speculators on its KL default, then on our objective) are their
    records' tables and commands, on the same token count; the second gives speculators our objective."""
    from benchmarks.bench_train_quality import table

    text = _section(DOC.read_text(), "### DSpark again, with its heads computed for all slots at once")
    record = _record(f"train_quality/{name}.json")
    assert f"benchmarks/results/train_quality/{name}.json" in text
    assert "AMD EPYC" in record["cpu"] and record["command"] in text and table(record["results"]) in text
    run = record["results"]["dspark"]
    assert set(record["results"]) == {"dspark"} and run["data"]["tokens"] == 153486
    assert f"{run['cpu_ratio']:.2f}×" in text
    assert ('{"ce": 0.1, "tv": 0.9}' in run["speculators"]["command"]) == name.endswith("same-objective")


@pytest.mark.parametrize("name,algos", [("amd-epyc-zen4-per-document", {"peagle", "dflash", "dspark"}),
                                        ("amd-epyc-zen4-per-document-split", {"dflash", "dspark"})])
def test_the_per_document_reruns_are_their_records(name, algos):
    """P-EAGLE, DFlash and DSpark after the heads-on-loss-rows and per-document attention changes (then DFlash and
    DSpark after the split): the section's tables, commands and ratios are the records', on the same token count,
    with speculators on our DSpark objective."""
    from benchmarks.bench_train_quality import table

    text = _section(DOC.read_text(), "### P-EAGLE, DFlash and DSpark again")
    record = _record(f"train_quality/{name}.json")
    assert f"benchmarks/results/train_quality/{name}.json" in text and "AMD EPYC" in record["cpu"]
    assert record["command"] in text and table(record["results"]) in text
    assert set(record["results"]) == algos
    for run in record["results"].values():
        assert run["data"]["tokens"] == 153486 and run["data"]["steps"] == 75
        assert f"{run['cpu_ratio']:.2f}×" in text
    assert '{"ce": 0.1, "tv": 0.9}' in record["results"]["dspark"]["speculators"]["command"]


def test_vllm_data_cost_table_is_its_record():
    """The recipe way against the vLLM-only way, per conversation, is the record's (AMD EPYC Zen 4)."""
    from benchmarks.bench_data_cost import table

    text = _section(DOC.read_text(), "### The recipes' way against vLLM only")
    record = _record("data_cost/amd-epyc-zen4-vllm.json")
    assert "benchmarks/results/data_cost/amd-epyc-zen4-vllm.json" in text and "AMD EPYC" in record["cpu"]
    assert record["command"] in text.replace(".venv/bin/python", "python")
    assert table(record) in text
    check = record["checks"][0]
    assert check["rows_equal"] == check["conversations"] and check["samples_equal"] == check["samples"]


def test_the_one_pass_beside_vllms_ways_is_its_record():
    """The in-process one pass against the recipe and vLLM ways (AMD EPYC Zen 4): table, ratios, starts, checks."""
    from benchmarks.bench_data_cost import table
    from engine.data.options import RegenerateOptions

    text = _section(DOC.read_text(), "### The in-process one pass beside vLLM's ways")
    record, narrow = _record("data_cost/amd-epyc-zen4-vllm-onepass-32.json"), \
        _record("data_cost/amd-epyc-zen4-vllm-onepass.json")
    before = _record("data_cost/amd-epyc-zen4-vllm.json")
    flat = text.replace(".venv/bin/python", "python")
    for rec in (record, narrow):
        assert rec["cpu_kind"] == "AVX-512 BF16" and rec["command"] in flat
    assert table(record) in text and record["onepass_batch"] == RegenerateOptions(out="x").batch_size
    per, starts, other = record["per_conversation_s"], record["starts_s"], narrow["per_conversation_s"]
    assert (f"recipe way costs {per['recipe']['total']:.2f} s here against "
            f"{before['per_conversation_s']['recipe']['total']:.2f} s there") in text
    assert (f"{per['vllm']['total']:.2f} s per conversation, against {per['onepass']['total']:.2f} s for the one pass\n"
            f"  ({per['onepass']['total'] / per['vllm']['total']:.1f}×)") in text
    assert f"vLLM keeps {record['wide']} requests" in text
    assert f"cheaper than the recipe way ({per['recipe']['total']:.2f} s)" in text
    within = max(abs(other[w]["total"] - per[w]["total"]) for w in ("recipe", "vllm"))
    assert (f"within\n  {within:.2f} s of these) the one pass cost {other['onepass']['total']:.2f} s per conversation, "
            f"{other['onepass']['total'] / other['vllm']['total']:.1f}× vLLM's way") in text
    fixed = starts["vllm"]["regenerate"] + starts["vllm"]["extract"] - starts["onepass"]["regenerate"]
    assert f"fewer than about {fixed / (per['onepass']['total'] - per['vllm']['total']):.0f} conversations" in text
    assert (f"({starts['onepass']['regenerate']:.0f} s against\n  {starts['vllm']['regenerate']:.0f} + "
            f"{starts['vllm']['extract']:.0f} s)") in text
    check, onepass = record["checks"][0], record["checks_onepass"][0]
    assert check["rows_equal"] == check["conversations"] == record["conversations"]
    assert f"all {check['conversations']} answers equal" in text
    assert (f"ones in {onepass['rows_equal']} of\n  {onepass['conversations']} conversations "
            f"({narrow['checks_onepass'][0]['rows_equal']} with 8 rows)") in text
    docs = " ".join(" ".join((ROOT / "docs" / name).read_text().split()) for name in ("data-files.md", "cli.md"))
    assert f"{per['vllm']['total']:.2f} s per conversation against {per['onepass']['total']:.2f} s for the" in docs
    vllm_start = starts["vllm"]["regenerate"] + starts["vllm"]["extract"]
    assert f"start is {starts['onepass']['regenerate']:.0f} s against vLLM's {vllm_start:.0f} s" in docs
    assert (f"{per['vllm']['regenerate']:.2f} s of regeneration per conversation through vLLM against "
            f"{per['onepass']['total']:.2f} s for the in-process one pass") in docs


def test_the_training_outcome_benchmark_refuses_a_work_folder_it_did_not_make(tmp_path):
    """It removes run folders inside --work: a folder of the user's is refused before anything is touched."""
    import subprocess
    import sys

    work = tmp_path / "mine"
    (work / "eagle3" / "ours").mkdir(parents=True)
    (work / "eagle3" / "ours" / "notes.txt").write_text("the user's")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train_quality.py"), "--train-jsonl", "x",
                           "--val-jsonl", "y", "--work", str(work)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "did not write" in proc.stderr and "Traceback" not in proc.stderr
    assert (work / "eagle3" / "ours" / "notes.txt").read_text() == "the user's"
    assert not (work / ".bench-train-quality").exists()


def test_the_first_position_gap_and_the_position_table_are_their_record():
    """The acceptance-by-position section: its table and both first-token figures are the record's (k = 3)."""
    text = _section(DOC.read_text(), "### Acceptance by answer position, and the first-position gap")
    acc = _record("evaluate/amd-epyc-avx2/first_position_eagle3.json")["by_k"]["3"]
    rows = [b for b in acc["by_answer_position"] if b["num_drafts"]]
    assert [(r["drafts"], r["mean acceptance length"]) for r in _table(text)] == [
        (str(b["num_drafts"]), f"{b['mean_acceptance_length']:.2f}") for b in rows]
    for key in ("first_token_acceptance_at_draft_starts", "first_token_acceptance_all_positions"):
        assert f"**{acc[key]:.3f}**" in text, key
    assert f"{acc['mean_acceptance_length']:.3f}" in text and "AVX2" in text


@pytest.mark.parametrize("algo", ["eagle3", "dflash"])
def test_acceptance_per_workload_is_its_record_in_the_doc_and_the_shipped_card(algo):
    """The per-workload table (chat, code; 95% intervals over prompts) in the history and in the shipped draft's
    card is the record's, row for row."""
    from engine.measure.evaluate import workload_lines
    from engine.recipes.model_card import workload_section

    record = _record(f"evaluate/amd-epyc-avx2/workloads_{algo}.json")
    rows = [line for line in workload_lines(record) if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[1] for r in rows[1:]] == ["chat", "code"]
    text = _section(DOC.read_text(), "### Acceptance per workload")
    assert all(row in text for row in rows) and "AVX2" in text
    for w in record["by_workload"] if algo == "eagle3" else []:  # the prose's per-prompt spread at k = 3
        k3 = w["by_k"]["3"]
        assert f"{k3['per_prompt_std']:.2f}" in text
        assert f"{k3['per_prompt_min']:.2f}–{k3['per_prompt_max']:.2f}" in text
    card = (ROOT / "assets" / "drafts" / f"smollm2-135m-instruct-{algo}" / "README.md").read_text()
    assert "\n".join(workload_section(record)).strip() in card


def test_the_dflash2_quality_row_is_its_record():
    """DFlash2 ours vs speculators 0.9.0's trainer (AVX2): the table, τ and speed figures, and the run before the
    target's distribution was computed once per step, all the records'."""
    from benchmarks.bench_train_quality import table

    text = _section(DOC.read_text(), "### DFlash2 against speculators' DFlash2 trainer")
    record = _record("train_quality/amd-epyc-avx2-dflash2.json")
    before = _record("train_quality/amd-epyc-avx2-dflash2-before-fix.json")
    assert record["cpu_kind"] == "AVX2" and set(record["results"]) == {"dflash2"}
    assert table(record["results"]) in text
    r = record["results"]["dflash2"]
    ours, theirs = r["ours"]["speed"]["tokens_per_cpu_s"], r["speculators"]["speed"]["tokens_per_cpu_s"]
    assert f"{r['ours']['eval']['tau']['3']:.3f} against {r['speculators']['eval']['tau']['3']:.3f}" in text
    assert f"missed by {1.3 - ours / theirs:.2f}" in text and f"({ours / theirs:.2f}×;" in text
    assert f"trained {before['results']['dflash2']['ours']['speed']['tokens_per_cpu_s']:.0f} tokens" in text
    assert before["results"]["dflash2"]["ours"]["eval"]["tau"] == r["ours"]["eval"]["tau"]  # same draft quality


def test_the_eagle3_card_quotes_one_speed_per_k_its_sweep_records():
    """Issue 45: the shipped EAGLE-3 card's results, k table and advice quote the sweep measured in interleaved
    rounds (each speed with its 95% interval), the same record the app opens on for this draft's speed."""
    from engine.recipes.model_card import sweep_from_card

    sweep = _record(f"{CARD_EAGLE3}/sweep.json")
    bench = _record(f"{CARD_EAGLE3}/bench.json")
    card = (ROOT / "assets" / "drafts" / "smollm2-135m-instruct-eagle3" / "README.md").read_text()
    assert sweep["rounds_kept"] >= 3 and sweep["num_prompts"] == bench["num_prompts"] == 20
    shown = sweep_from_card(card)
    assert [r["k"] for r in shown] == [r["k"] for r in sweep["rows"]]
    for got, row in zip(shown, sweep["rows"], strict=True):
        assert got["speedup"] == round(row["speedup"], 2)
        assert got["spread"]["ci95"] == [round(x, 2) for x in row["spread"]["ci95"]]
    at_k = next(r for r in sweep["rows"] if r["k"] == bench["k"])
    lo, hi = at_k["spread"]["ci95"]
    assert f"wall-clock speedup **{at_k['speedup']:.2f}× ({lo:.2f}–{hi:.2f})**" in card  # one speed for k = 3
    best = max(sweep["rows"], key=lambda r: r["speedup"])
    ngram = sweep["methods"]["ngram"]["speedup"]
    assert (f"n-gram proposer measured faster on the card's CPU ({ngram:.2f}×" in card if ngram > best["speedup"]
            else f"Recommended k on the card's CPU: {best['k']} (measured {best['speedup']:.2f}×" in card)


def test_one_speed_per_k_section_is_its_records():
    """The per-k table, the single run beside it, the forecast's error and the one acceptance across engines: all the
    committed records' (the shipped EAGLE-3 draft measured again, 2026-12-05)."""
    text = _section(DOC.read_text(), "## One speed per k")
    sweep, bench = _record(f"{CARD_EAGLE3}/sweep.json"), _record(f"{CARD_EAGLE3}/bench.json")
    evaluated, vllm = _record(f"{CARD_EAGLE3}/evaluate.json"), _record(f"{CARD_EAGLE3}/vllm_bench.json")
    rows = _table(text)
    for row, rec in zip(rows, [*sweep["rows"], sweep["methods"]["ngram"]], strict=True):
        a, c = rec["acceptance_ci95"], rec["spread"]["ci95"]
        assert row["k"] == str(rec["k"]) and row["method"] == ("n-gram" if rec["method"] == "ngram" else "draft")
        assert row["mean acceptance length"] == f"{rec['mean_acceptance_length']:.3f} ({a[0]:.2f}–{a[1]:.2f})"
        assert row["speedup"] == f"{rec['speedup']:.2f}× ({c[0]:.2f}–{c[1]:.2f})"
        assert row["step cost (baseline steps)"] == f"{rec['step_cost']:.2f}"
    assert "Four rounds" in text and len(sweep["rounds"]) == sweep["rounds_kept"] == 4
    assert f"at most {100 * max(r['other_load'] for r in sweep['rounds']):.1f}% of the CPUs" in text
    assert f"Baseline\n{sweep['methods']['baseline']['tokens_per_s']:.1f} tokens/s" in text
    single = bench["methods"]
    assert f"measured {single['draft']['speedup']:.2f}× at k = 3 (n-gram\n  {single['ngram']['speedup']:.2f}×)" in text
    forecast = ", ".join(f"{evaluated['forecast']['by_k'][k]['speedup']:.2f}×" for k in evaluated["by_k"])
    assert forecast.replace(", 1.13×", " and 1.13×") in text.replace("\n  ", " ")
    errors = [abs(evaluated["forecast"]["by_k"][str(r["k"])]["speedup"] - r["speedup"]) for r in sweep["rows"]]
    assert max(errors) < 0.075 and max(errors[1:]) < 0.025  # "within 0.07× at every k, within 0.02× at k = 2…5"
    taus = (evaluated["by_k"]["3"]["mean_acceptance_length"], sweep["rows"][2]["mean_acceptance_length"],
            vllm["methods"]["draft"]["mean_acceptance_length"])
    assert f"the evaluator {taus[0]:.3f}, in-process decoding {taus[1]:.3f},\n  real vLLM {taus[2]:.3f}" in text
    assert f"The largest\n  difference is {max(taus) - min(taus):.3f}" in text


def test_the_attribution_table_is_its_record():
    """Issue 45: factor -> change in τ, every row the committed record's; the trainer's figures it explains are the
    training metrics'."""
    text = _section(DOC.read_text(), "## Why one draft has five acceptance figures")
    record = _record("attribution/amd-epyc-zen4.json")
    assert "bench_attribution.py" in record["command"] and record["cpu_kind"] == "AVX-512 BF16"
    for row, rec in zip(_table(text), record["rows"], strict=True):
        ci = f" ({rec['ci95'][0]:.2f}–{rec['ci95'][1]:.2f})" if rec["ci95"] else ""
        assert (row["factor"], row["protocol"]) == (rec["factor"], rec["change"])
        assert row["τ at k = 3"] == f"{rec['tau']:.3f}{ci}"
        assert row["change"] == ("–" if rec["delta"] is None else f"{rec['delta']:+.2f}")
    val = [json.loads(x) for x in (RESULTS / "reship-eagle3" / "amd-epyc-zen4" / "recipe" / "train-metrics.jsonl")
           .open() if '"val"' in x][-1]
    assert f"trainer's estimate), {val['walk_acceptance_length']:.2f}" in text.replace("\n", " ")
    assert f"{val['est_acceptance_length']:.2f} (the trainer's estimate)" in text.replace("\n", " ")
    assert f"(−{val['est_acceptance_length'] - val['walk_acceptance_length']:.2f})" in text


def test_the_dflash2_zen4_row_is_its_records():
    """Issue 43 on the Zen 4: both trainers in one run, the ratio, and ours the day before the drafted-slots change,
    all the records'; τ unchanged by it (the same loss)."""
    text = _section(DOC.read_text(), "### DFlash2 against speculators' DFlash2 trainer (AMD EPYC, Zen 4)")
    r = _record("train_quality/amd-epyc-zen4-dflash2.json")["results"]["dflash2"]
    before = _record("train_quality/amd-epyc-zen4-dflash2-before-drafted-slots.json")["results"]["dflash2"]
    ours, theirs = r["ours"]["speed"]["tokens_per_cpu_s"], r["speculators"]["speed"]["tokens_per_cpu_s"]
    rows = {row["trainer"]: row for row in _table(text)}
    assert rows["ours (fp32)"]["tokens per CPU-second"] == f"{ours:.0f}"
    assert rows["speculators 0.9.0 (fp32)"]["tokens per CPU-second"] == f"{theirs:.0f}"
    assert rows["ours (fp32)"]["tokens per CPU-s / speculators'"] == f"{ours / theirs:.2f}×" and ours / theirs >= 1.3
    assert rows["ours (fp32)"]["τ k=3"] == f"{r['ours']['eval']['tau']['3']:.3f}"
    b_ours, b_theirs = (before[x]["speed"]["tokens_per_cpu_s"] for x in ("ours", "speculators"))
    assert f"ours trained {b_ours:.0f} tokens per CPU-second against speculators' {b_theirs:.0f}" in text.replace(
        "\n", " ") and f"({b_ours / b_theirs:.2f}×," in text
    assert before["ours"]["eval"]["tau"] == r["ours"]["eval"]["tau"]  # the same draft quality
    paired = _record("train_quality/amd-epyc-zen4-dflash2-paired.json")  # the same evaluations, sample by sample
    assert paired["ours"]["tau"] == r["ours"]["eval"]["tau"]["3"] and paired["k"] == 3
    d = paired["difference"]
    flat = text.replace("\n", " ")
    assert f"the {d['n']} held-out samples" in flat
    assert f"difference is {d['mean']:+.4f}, 95% t interval {d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}".replace(
        "-", "−").replace("interval +", "interval ").replace("is +", "is ") in flat
    higher, equal, lower = paired["samples_higher_equal_lower"]
    assert f"({higher} samples higher, {equal} equal, {lower} lower;" in flat
    more = _record("train_quality/amd-epyc-zen4-dflash2-paired-100.json")  # the same drafts, 100 prompts
    d, (higher, equal, lower) = more["difference"], more["samples_higher_equal_lower"]
    assert d["n"] == more["ours"]["num_samples"] == 100 and d["ci95"][1] > 0
    words = " ".join(text.split())
    lo, hi = (f"{x:+.4f}".replace("-", "−") for x in d["ci95"])
    assert f"{more['ours']['tau']:.3f} against {more['theirs']['tau']:.3f}, per-sample difference " \
        f"{d['mean']:+.4f}, 95% t interval {lo} to {hi}" in words
    assert f"({higher} samples higher, {equal} equal, {lower} lower)" in words


def test_the_bandwidth_limit_is_its_record():
    """Issue 50: the bandwidth, the limit per dtype and the share the engine reaches, the records'."""
    text = _section(DOC.read_text(), "### A second, faster Zen 4")
    record = _record("bandwidth/amd-epyc-zen4.json")
    vllm = _record(f"{CARD_EAGLE3}/vllm_bench.json")["methods"]["baseline"]["tokens_per_s"]
    assert f"torch reads {record['read_gb_s']:.1f} GB/s" in text and f"{record['copy_gb_s']:.1f} GB/s" in text
    rows = {row["target dtype"]: row for row in _table(text.split("Memory bandwidth is not")[1])}
    for rec in record["rows"]:
        row = rows[rec["dtype"]]
        assert row["weight bytes per token"] == f"{rec['bytes'] / 1e6:.0f} MB"
        assert row["limit at read bandwidth"] == f"{rec['limit_tokens_per_s']:.0f} tokens/s"
        if rec.get("achieved_tokens_per_s"):
            assert row["engine baseline"] == f"{rec['achieved_tokens_per_s']:.1f} tokens/s"
            assert row["share of the limit"] == f"{rec['achieved_tokens_per_s'] / rec['limit_tokens_per_s']:.0%}"
    bf16 = next(r for r in record["rows"] if r["dtype"] == "bf16")
    assert f"({vllm:.1f} tokens/s on the same prompts) {vllm / bf16['limit_tokens_per_s']:.0%}" in text


def test_the_draft_kernels_table_is_its_record():
    """Issue 50: the draft with packed linears beside plain F.linear, interleaved: the record's figures."""
    text = _section(DOC.read_text(), "### A second, faster Zen 4").split("The draft's own linears")[1]
    record = _record("decode_speed/amd-epyc-zen4-2026-12-04/draft-kernels.json")
    for row, rec in zip(_table(text), record["rows"], strict=True):
        assert row["draft linears"] == rec["draft_linears"] and row["form"] == rec["linear_form"]
        assert row["mean acceptance length"] == f"{rec['mean_acceptance_length']:.3f}"
        assert row["speedup (95% interval over rounds)"] == \
            f"{rec['speedup']:.3f}× ({rec['ci95'][0]:.3f}–{rec['ci95'][1]:.3f})"
        assert rec["identical_to_baseline"] and row["identical"] == "yes"
    plain, packed = (r["speedup"] for r in record["rows"])
    assert f"+{packed - plain:.2f}×" in text and f"by {1.3 - packed:.2f}" in text


def test_the_vllm_k_norm_table_is_its_record():
    """Issue 44's finding: the CPU build's grouped K norm, and acceptance with it emulated, the record's."""
    text = _section(DOC.read_text(), "## The re-shipped DFlash draft: the EAGLE-3 draft's conversations "
                                     "(AMD EPYC Zen 4)")
    record = _record("vllm_k_norm/amd-epyc-zen4.json")
    assert "bench_vllm_k_norm.py" in record["command"] and record["cpu_kind"] == "AVX-512 BF16"
    assert record["kernel"]["vs_row0"] == 0.0 and f"is {record['kernel']['vs_per_layer']:.2f} off" in text
    rows = {row["context keys"]: row for row in _table(text.split("norms every draft layer's context keys")[1])}
    names = {"as trained": "as trained", "layer 0's k_norm on every layer": "layer 0's k_norm on every layer",
             "vLLM's CPU build (committed record)": "vLLM's CPU build (the record above)"}
    per = {}
    for name, rec in record["rows"].items():
        row = rows[names[name]]
        per[name] = rec["num_accepted_tokens"] / rec["num_drafts"]
        assert (row["drafts"], row["accepted"]) == (str(rec["num_drafts"]), str(rec["num_accepted_tokens"]))
        assert row["accepted per draft"] == f"{per[name]:.3f}"
    trained, emulated, vllm = per.values()
    assert f"explains {trained - emulated:.3f} of the {trained - vllm:.3f} gap" in text


def test_the_zen4_data_cost_table_is_its_record():
    """Issue 50's data row for this machine kind: both ways per conversation and their ratio, the record's."""
    record = _record("data_cost/amd-epyc-zen4-onepass.json")
    text = _section(DOC.read_text(), "### One pass against two steps on the AMD EPYC Zen 4")
    assert "bench_onepass.py" in record["command"] and record["cpu_kind"] == "AVX-512 BF16"
    _check_data_cost_rows(record, text)
    assert f"**{record['ratio']:.2f}** (CPU seconds {record['cpu_ratio']:.2f})" in text
    parts, wall = record["two_steps_parts_per_conversation_s"], record["per_conversation_s"]
    assert f"decoding is {parts['regenerate'] / wall['two_steps']:.0%} of the two steps" in text
    assert record["outputs"]["rows_equal"] and record["outputs"]["tokens_equal"]


def test_the_fused_batch_data_cost_is_its_record():
    """Issue 50's data goal on the fused batch: the four ways per conversation, the ratios and the outputs' checks."""
    record = _record("data_cost/amd-epyc-zen4-onepass-refill.json")
    before = _record("data_cost/amd-epyc-zen4-onepass-fused.json")
    text = _section(DOC.read_text(), "### One pass on the fused decoder's batch")
    for rec in (record, before):
        assert "bench_onepass.py" in rec["command"] and rec["cpu_kind"] == "AVX-512 BF16"
        assert rec["one_pass_backend"] == "fused-onepass" and rec["ratio"] <= 1 / 3
    assert record["command"] in text.replace(".venv/bin/python", "python") and record["target_dtype"] in text
    from engine.data.answers.regenerate import FUSED_GROUP

    assert f"hands it {['one', 'two', 'three', 'four'][FUSED_GROUP - 1]} batches per call" in text
    out = record["outputs"]
    assert (f"{record['conversations']} ShareGPT prompts ({out['samples']} samples written) in\nchunks of "
            f"{record['chunk']}, batches of {record['batch_size']}, {record['threads']} threads") in text
    wall, cpu = record["per_conversation_s"], record["per_conversation_cpu_s"]
    rows = {r["way"]: r for r in _table(text)}
    for way, key in (("regenerate (transformers), then extract", "two_steps"),
                     ("regenerate (fused batch), then extract", "two_steps_fused"),
                     ("one pass, fused batch", "one_pass"),
                     ("one pass, transformers decoding", "one_pass_transformers")):
        assert rows[way]["s per conversation"] == f"{wall[key]:.2f}", way
        assert rows[way]["CPU s per conversation"] == f"{cpu[key]:.2f}", way
    assert f"**{record['ratio']:.2f}** (goal ≤ 1/3, met)" in text
    assert f"costs {record['ratio_transformers_decoding']:.2f} of the two steps" in text
    two, fused = (record[f"{k}_parts_per_conversation_s"] for k in ("two_steps", "two_steps_fused"))
    assert (f"from {two['regenerate']:.2f} to {fused['regenerate']:.2f} s per conversation "
            f"({two['regenerate'] / fused['regenerate']:.1f}×)") in text
    assert f"the one pass costs {record['ratio_to_fused_two_steps']:.2f}" in text
    assert f"extraction\n  forward ({fused['extract']:.2f} s)" in text
    assert all(record[k]["rows_equal"] and record[k]["tokens_equal"]
               for k in ("outputs", "outputs_fused_two_steps", "outputs_transformers_decoding"))
    assert f"loss masks of all {out['samples']} samples" in text
    share = f"{out['share_of_values_differing']:.2%}"
    assert f"{share} of the\n  values (max |difference| {out['max_abs_diff']:.0f})" in text
    assert f"max |difference| {record['exact_check']['max_abs_diff']:.2g}" in text
    assert (f"{before['conversations']} prompts in chunks of {before['batch_size']}): one pass "
            f"{before['per_conversation_s']['one_pass']:.2f} s per conversation, {before['ratio']:.2f} of the") in text


def test_the_fused_decoder_figures_are_their_records():
    """Issue 50 on the fused decoder path: baseline against transformers and vLLM, the kernel choice's timings, the
    bandwidth share and the shipped draft's speedups, each the record's."""
    text = _section(DOC.read_text(), "### The fused decoder")
    folder = "decode_speed/amd-epyc-zen4-2026-12-05"
    gen = _record(f"{folder}/baseline_generate-fused.json")
    bench, vllm = _record(f"{folder}/bench.json"), [_record(f"{folder}/vllm_bench{s}.json") for s in ("", "-2")]
    for rec in (gen, bench, *vllm):
        assert rec["cpu_kind"] == "AVX-512 BF16"
    speeds = gen["tokens_per_s"]
    engine = speeds["engine baseline (auto: bf16-fused-packed-masked)"]
    rows = {row["decoding"]: row["tokens/s"] for row in _table(text)}
    assert rows["engine baseline, auto (bf16-fused-packed-masked, bit-identical)"] == f"{engine:.1f}"
    assert rows["transformers `generate`, bf16 (its faster dtype)"] == f"{speeds['transformers generate (bf16)']:.1f}"
    assert rows["transformers `generate`, fp32"] == f"{speeds['transformers generate (fp32)']:.1f}"
    assert rows["engine baseline, auto, in `bench`"] == f"{bench['methods']['baseline']['tokens_per_s']:.1f}"
    v = [r["methods"]["baseline"]["tokens_per_s"] for r in vllm]
    assert [rows["vLLM CPU build, no draft, first run"], rows["vLLM CPU build, no draft, second run"]] == \
        [f"{x:.1f}" for x in v]
    assert f"**{engine / speeds['transformers generate (bf16)']:.2f}×**" in text
    assert f"**{engine / max(v):.2f}–{engine / min(v):.2f}×**" in text
    candidates = bench["kernel"]["candidates"]
    fused, packed = candidates["bf16-fused-packed-masked"], candidates["bf16-routed-packed-masked"]
    assert fused["row_exact"] and bench["kernel"]["path"] == "bf16-fused-packed-masked"
    assert f"took {fused['ms_1']:.1f} ms per\ntoken and {fused['ms_k1']:.1f} ms for 4 tokens, against " \
           f"{packed['ms_1']:.1f} and {packed['ms_k1']:.1f}" in text
    later = _record(f"{folder}/bench-kernel-choice.json")["kernel"]["candidates"]
    f32, plain = later["fp32-fused-packed-masked"], later["fp32"]
    assert f"took {f32['ms_1']:.1f} and {f32['ms_k1']:.1f} ms against {plain['ms_1']:.1f} and {plain['ms_k1']:.1f} " \
           "for plain fp32, not row-exact here" in text.replace("\n", " ") and not f32["row_exact"]
    bw = _record("bandwidth/amd-epyc-zen4-2026-12-05.json")
    row = bw["rows"][0]
    assert f"at the {bw['read_gb_s']:.1f} GB/s read here is {row['limit_tokens_per_s']:.0f} tokens/s" in text
    assert f"reaches {row['achieved_tokens_per_s'] / row['limit_tokens_per_s']:.0%} of it" in text
    draft_rows = {row["method"]: row for row in _table(text.split("recipes' benchmark")[1])}
    methods = _record(f"{folder}/bench-20x128.json")["methods"]
    for name, row in draft_rows.items():
        rec = methods[name]
        assert row["tokens/s"] == f"{rec['tokens_per_s']:.1f}" and row["speedup"] == f"{rec['speedup']:.2f}×"
        assert row["mean acceptance length"] == ("–" if rec["mean_acceptance_length"] is None
                                                 else f"{rec['mean_acceptance_length']:.2f}")
        assert rec["identical_to_baseline"] and row["identical"] == "yes"
    packed_draft = _record(f"{folder}/draft-kernels.json")["rows"][1]
    assert f"reaches {packed_draft['speedup']:.3f}× (95% interval {packed_draft['ci95'][0]:.3f}–" \
           f"{packed_draft['ci95'][1]:.3f}; τ {packed_draft['mean_acceptance_length']:.3f})" in text
    assert packed_draft["speedup"] >= 1.3 and "The goal (≥ 1.3×) is met there" in text
    plain32, packed32 = _record(f"{folder}/draft-kernels-fp32.json")["rows"]
    assert f"went from {plain32['speedup']:.3f}× ({plain32['ci95'][0]:.3f}–{plain32['ci95'][1]:.3f})\nto " \
           f"{packed32['speedup']:.3f}× ({packed32['ci95'][0]:.3f}–{packed32['ci95'][1]:.3f})" in text
    assert packed32["linear_form"] == "packed" and packed32["identical_to_baseline"]
    second = _record(f"{folder}/bench-20x128-2.json")["methods"]
    assert f"gave {second['draft']['speedup']:.3f}× (n-gram {second['ngram']['speedup']:.3f}×)" in text
    assert f"missed by {1.3 - methods['draft']['speedup']:.2f} in the 20-prompt runs" in text
    runs = (methods["draft"], second["draft"])
    assert f"Drafting takes {100 * runs[0]['draft_fraction']:.1f}% and {100 * runs[1]['draft_fraction']:.1f}% " \
           "of a speculative step" in text
    assert f"would be {runs[0]['speedup_ceiling']:.2f}× and {runs[1]['speedup_ceiling']:.2f}×" in text


def test_the_dflash2_recipe_drafts_figures_are_its_records():
    """Issue 43's recipe draft beside the shipped drafts: τ per k of the three drafts (evaluated on the same day, CPU,
    dtype and prompts), the selector ablation, the data and tokens seen, all the committed records'."""
    text = DOC.read_text()
    folder = "dflash2-recipe/amd-epyc-zen4"
    section = _chapter(text, "## The DFlash2 recipe's draft beside the shipped drafts")
    evaluated = {name: _record(f"{folder}/{file}") for name, file in
                 (("DFlash2, this recipe", "evaluate.json"), ("DFlash, shipped", "dflash-evaluate.json"),
                  ("EAGLE-3, shipped", "eagle3-evaluate.json"))}
    assert len({e["draft_sha256"] for e in evaluated.values()}) == 3  # three drafts
    for e in evaluated.values():
        assert (e["cpu"], e["date"], e["target_dtype"], e["num_samples"], e["max_new_tokens"]) == \
            (evaluated["DFlash2, this recipe"]["cpu"], evaluated["DFlash2, this recipe"]["date"], "bf16", 20, 128)
    rows = _table(section.split("Decoding-exact acceptance per k")[1])
    assert [r["k"] for r in rows] == list(evaluated["DFlash2, this recipe"]["by_k"])
    for row in rows:
        for name, e in evaluated.items():
            by_k = e["by_k"].get(row["k"])
            assert row[f"τ ({name})"] == (f"{by_k['mean_acceptance_length']:.3f}" if by_k else "–"), (row["k"], name)
    ablation = _record(f"{folder}/selector-ablation.json")
    assert ablation["draft_sha256"] == evaluated["DFlash2, this recipe"]["draft_sha256"]
    rows = _table(section.split("What the selector buys")[1])
    assert [int(r["k"]) for r in rows] == [r["k"] for r in ablation["rows"]]
    for row, r in zip(rows, ablation["rows"], strict=True):
        assert row["τ as trained"] == f"{r['as_trained']:.3f}" and row["τ with the selector zeroed"] == \
            f"{r['zeroed']:.3f}" and row["difference"] == f"{r['difference']:+.3f}"
    manifest = _record(f"{folder}/recipe/hidden-manifest.json")
    metrics = [json.loads(x) for x in (RESULTS / folder / "recipe" / "train-metrics.jsonl").open()]
    seen = sum(r.get("tokens", 0) for r in metrics if r["split"] == "train")
    flat = " ".join(section.split())  # prose figures across line breaks
    assert f"{manifest['samples']:,} conversations" in flat and f"{seen:,.0f} tokens seen" in flat
    assert f"{manifest['tokens']:,} tokens" in flat and f"{manifest['loss_tokens']:,} of them in the loss" in flat
    row = {r["draft"]: r for r in _table(_section(text, "### Acceptance against data"))}["DFlash2 (its card)"]
    assert row["decoding-exact τ at k = 3 (20 held-out prompts)"] == \
        f"{evaluated['DFlash2, this recipe']['by_k']['3']['mean_acceptance_length']:.3f}"
    assert row["conversations"] == f"{manifest['samples']:,}"
    assert row["assistant tokens"] == f"{manifest['loss_tokens']:,}"
    from engine.format.checkpoint import tensor_index

    for name, draft in (("", "dflash2"), ("DFlash's ", "dflash")):  # sizes: the shipped files
        weights = ROOT / "assets" / "drafts" / f"smollm2-135m-instruct-{draft}" / "model.safetensors"
        params = sum(math.prod(t.shape) for t in tensor_index(weights.parent).values())
        assert f"{name}{params / 1e6:.2f}M" in flat and f"{weights.stat().st_size / 1e6:.1f} MB" in flat, draft
    config = json.loads((ROOT / "assets/drafts/smollm2-135m-instruct-dflash2/config.json").read_text())
    codebooks = 2 * config["transformer_layer_config"]["vocab_size"] * config["selector_rank"]
    assert f"{codebooks / 1e6:.2f}M parameters (2 × {codebooks // 2 // config['selector_rank']:,} × " \
        f"{config['selector_rank']}), {codebooks * 2 / 1e6:.1f} MB in bf16" in flat
    curve = {r["step"]: r for r in _record(f"{folder}/curve.json")["rows"]}
    at = [r for r in curve.values() if 3.8e6 < r["training_tokens"] < 4e6][0], curve[max(curve)]
    assert f"{at[0]['mean_acceptance_length']:.2f} at {at[0]['training_tokens'] / 1e6:.1f}M tokens, " \
        f"{at[1]['mean_acceptance_length']:.2f} at {at[1]['training_tokens'] / 1e6:.1f}M" in flat
    steps = {s: _record(f"{folder}/recipe/steps/{s}.json") for s in ("extract", "train")}
    assert f"made again here in {steps['extract']['seconds'] / 60:.1f} min" in flat
    assert f"bf16 autocast, {steps['train']['seconds'] / 60:.1f} min" in flat
    assert "--algo dflash2" in steps["train"]["command"]
    walk = [r for r in metrics if r["split"] == "val"][-1]["walk_acceptance_length"]
    assert f"the validation walk (3% of the training conversations) reached {walk:.2f}" in flat
    sweep = {r["k"]: r["speedup"] for r in _record(f"{folder}/sweep.json")["rows"]}
    assert f"{sweep[1]:.2f}× at k = 1, {sweep[3]:.2f}× at k = 3, {sweep[5]:.2f}× at k = 5, {sweep[7]:.2f}× at k = 7" \
        in flat
    card = (ROOT / "assets" / "drafts" / "smollm2-135m-instruct-dflash2" / "README.md").read_text()
    bench = _record(f"{folder}/bench.json")["methods"]["draft"]
    assert f"Mean acceptance length **{bench['mean_acceptance_length']:.2f}**" in card
    assert f"| 3 | {evaluated['DFlash2, this recipe']['by_k']['3']['mean_acceptance_length']:.3f} |" in card


def test_the_suite_time_table_in_docs_testing_is_its_records():
    """docs/testing.md's suite times: each row's minutes and test count are its record's (`default`)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    rows = _table(text[text.index("| machine | default suite"):])
    assert len(rows) >= 5
    for row in rows:
        path = row["record (20 slowest tests included)"].strip("`").removeprefix("benchmarks/results/")
        run = _record(path)["default"]
        minutes, _, count = row["default suite (2 workers)"].replace("**", "").partition(", ")
        assert minutes == f"{run['seconds'] / 60:.1f} min", path
        counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (passed|failed)", run["summary"]))
        expected = f"{counts['passed']} passed" + (f", {counts['failed']} failed" if counts.get("failed") else "")
        assert count == expected, path  # a run with failures says so: its count of tests is not a pass
