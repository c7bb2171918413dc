"""The Train page's distributed options: processes and strategy, a torchrun job, per-rank progress."""

from __future__ import annotations

import json
from pathlib import Path

from engine import jobs

# the helpers and fixtures of the main app test module
from testkit.app import ok, only_job, open_app, texts
from ui import training


def test_train_page_launches_torchrun_and_shows_each_rank(runs, tiny_target, tiny_dataset):
    at = open_app(tiny_target, page="train")
    at.button(key="train_smoke").click().run()
    at.text_input(key="train_f_online_dataset").set_value(tiny_dataset).run()
    at.number_input(key="train_f_max_steps").set_value(3).run()
    assert at.number_input(key="train_nproc").value == 1
    assert "python -m engine train" in texts(at.code)
    strategy = at.selectbox(key="train_f_strategy")  # generated from TrainConfig.strategy
    assert strategy.value == "ddp" and list(strategy.options) == ["ddp", "fsdp"]
    strategy.set_value("fsdp").run()
    at.number_input(key="train_nproc").set_value(2).run()
    ok(at)
    command = texts(at.code)
    assert "torchrun --standalone --nproc-per-node 2 -m engine train" in command and "--strategy fsdp" in command
    at.button(key="train_launch").click().run()
    ok(at)
    job = only_job(runs, "train")
    assert job.launcher == training.launcher(2) and "--strategy" in job.argv
    assert job.command.startswith("torchrun --standalone --nproc-per-node 2 -m engine train")
    done = jobs.wait(job, timeout=300)
    assert done.status.state == "done", done.log_tail(60)
    out = training.train_out(job)
    ranks = training.rank_progress(out)
    steps = ranks[0]["total_steps"]  # at most 3: the data may run out first
    assert [(r["rank"], r["world"], r["state"], r["step"]) for r in ranks] == [(0, 2, "done", steps),
                                                                               (1, 2, "done", steps)]
    at.run()
    ok(at)
    assert any("2 ranks" in m.value for m in at.markdown)
    table = at.dataframe[0].value
    assert list(table["rank"]) == [0, 1] and list(table["step"]) == [f"{steps}/{steps}"] * 2


def test_launcher_and_command_of_one_and_several_processes():
    assert training.launcher(1) is None
    assert training.launch_command(["train", "--out", "a b"], 1) == "python -m engine train --out 'a b'"
    assert training.launch_command(["train"], 4) == "torchrun --standalone --nproc-per-node 4 -m engine train"
    job = jobs.Job(id="x", dir=Path("."), kind="train", argv=["train"], created=0.0, status=jobs.JobStatus(),
                   launcher=training.launcher(4))
    assert training.job_processes(job) == 4


def test_progress_table_rows(tmp_path):
    (tmp_path / "progress").mkdir()
    for r in (1, 0):
        (tmp_path / "progress" / f"rank{r}.json").write_text(json.dumps(
            {"rank": r, "world": 2, "host": "h", "pid": 10 + r, "state": "running", "step": 5, "total_steps": 9,
             "epoch": 0, "cursor": 5, "updated": 100.0}))
    (tmp_path / "progress" / "rank2.json").write_text("{")  # being written
    rows = training.progress_table(training.rank_progress(tmp_path), now=103.0)
    assert [r["rank"] for r in rows] == [0, 1] and rows[0]["step"] == "5/9" and rows[0]["updated (s ago)"] == 3.0
