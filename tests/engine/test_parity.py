"""Training–serving parity: a tiny run's record against serving it, and each difference the check must name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.data.options import ExtractOptions, RegenerateOptions
from engine.measure.parity import DIFFERS, SAME, UNKNOWN, parity
from testkit.training import config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tiny_targets, tmp_path_factory):
    """A tiny EAGLE-3 run on answers the tiny target regenerated (greedy) and extracted in bf16."""
    from engine.data.answers.dataset import regenerate_dataset
    from engine.data.extract.dataset import extract_dataset
    from engine.train.trainer import Trainer

    target, work = tiny_targets["llama"], tmp_path_factory.mktemp("parity")
    regenerate_dataset(RegenerateOptions(target=str(target), dataset="sharegpt", max_samples=4, max_turns=1,
                                         max_new_tokens=8, out=str(work / "regen.jsonl"), device="cpu"))
    extract_dataset(ExtractOptions(target=str(target), dataset=str(work / "regen.jsonl"), split="all",
                                   out=str(work / "data"), algo="eagle3", max_length=96, dtype="bf16"),
                    progress=False)
    Trainer(config(target, work / "data", work / "run", max_steps=2, max_length=96, val_fraction=0.0)).run()
    return target, work


def _verdicts(result) -> dict[str, str]:
    return {f["factor"]: f["verdict"] for f in result["findings"]}


def test_a_run_served_as_trained_has_no_difference(run):
    target, work = run
    result = parity(work / "run" / "draft", target=str(target), dtype="bfloat16", max_model_len=96)
    verdicts = _verdicts(result)
    assert result["run"] == str((work / "run").resolve())
    assert verdicts.pop("hidden states computed by") == DIFFERS  # transformers extracted, vLLM serves
    assert set(verdicts.values()) == {SAME}, result["findings"]


def test_each_difference_is_named_with_its_effect(run, tiny_targets, tmp_path):
    target, work = run
    draft = tmp_path / "draft"
    shutil.copytree(work / "run" / "draft", draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]  # edited after training
    (draft / "config.json").write_text(json.dumps(cfg))
    result = parity(draft, run=work / "run", target=str(target), dtype="float32", max_model_len=4096)
    verdicts = _verdicts(result)
    for factor in ("aux layer ids (vLLM numbering)", "hidden-state dtype", "context length"):
        assert verdicts[factor] == DIFFERS, factor
    effects = {f["factor"]: f["effect"] for f in result["findings"]}
    assert "other layers" in effects["aux layer ids (vLLM numbering)"] and effects["context length"]
    other = parity(work / "run" / "draft", target=str(tiny_targets["qwen3"]), max_model_len=96)
    assert _verdicts(other)["target weights"] == DIFFERS and _verdicts(other)["training answers"] == DIFFERS


def test_answers_the_target_did_not_write_and_a_draft_without_its_run(run, tmp_path):
    target, work = run
    manifest = json.loads((work / "data" / "manifest.json").read_text())
    assert manifest["chat_template_sha256"]  # the template the data was rendered with is recorded
    rows = [json.loads(x) for x in (work / "regen.jsonl").read_text().splitlines()]
    theirs = tmp_path / "theirs.jsonl"  # the same rows without the regenerate record: the dataset's own answers
    theirs.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "regenerated"}) + "\n" for r in rows))
    data = tmp_path / "data"
    shutil.copytree(work / "data", data)
    (data / "manifest.json").write_text(json.dumps({**manifest, "dataset": str(theirs)}))
    runs = tmp_path / "run"
    shutil.copytree(work / "run", runs)
    text = (runs / "config.yaml").read_text().replace(str(work / "data"), str(data))
    (runs / "config.yaml").write_text(text)
    result = parity(runs / "draft", target=str(target), max_model_len=96)
    answers = next(f for f in result["findings"] if f["factor"] == "training answers")
    assert answers["verdict"] == DIFFERS and "regenerate" in answers["effect"]
    alone = tmp_path / "alone"
    shutil.copytree(work / "run" / "draft", alone)
    lone = parity(alone, target=str(target))
    assert lone["run"] is None and lone["unknown"] >= 6 and _verdicts(lone)["chat template"] == UNKNOWN


def test_parity_cli_prints_the_table_and_refuses_a_folder_that_is_not_a_run(run, tmp_path):
    target, work = run
    cmd = [sys.executable, "-m", "engine", "parity", "--draft", str(work / "run" / "draft"), "--target", str(target)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| factor | training | serving (vLLM) | verdict |" in proc.stdout and "difference(s)" in proc.stdout
    bad = subprocess.run([*cmd, "--run", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode != 0 and "not a training run's folder" in bad.stderr and "Traceback" not in bad.stderr
