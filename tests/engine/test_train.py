"""EAGLE-3 training: learning happens, exact resume, DDP agreement, MoE targets, recipes, checkpoints vLLM accepts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.format.checkpoint import tensor_index
from engine.format.validate import validate_draft
from engine.train.config import TrainConfig
from engine.train.trainer import Trainer
from testkit.training import ROOT, config, extract, read_metrics


@pytest.fixture(scope="module")
def tiny_data(tiny_targets, tmp_path_factory) -> Path:
    return extract(tiny_targets["llama"], tmp_path_factory.mktemp("hs") / "llama")


def _validation_walk_is_evaluates(trainer: Trainer) -> None:
    """The trainer's validation walk on its held-out split equals `evaluate`'s on the same samples (one protocol)."""
    from engine.generate.acceptance import held_out_sample
    from engine.measure.evaluate import evaluate_samples

    val = trainer.validate()
    cols = list(trainer.layout.aux_columns)
    samples = [held_out_sample(s["token_ids"], s["hidden_states"][:, cols].flatten(1), s["loss_mask"], None, str(i))
               for i in trainer.val_idx if (s := trainer.data[i]) is not None]
    k = trainer.draft.config.speculative_tokens
    evaluated = evaluate_samples(trainer.algo, trainer.draft, [x for x in samples if x], [k])["by_k"][str(k)]
    assert val["walk_acceptance_length"] == pytest.approx(evaluated["mean_acceptance_length"], abs=1e-9)
    assert val["walk_first_token_acceptance_at_draft_starts"] == pytest.approx(
        evaluated["first_token_acceptance_at_draft_starts"], abs=1e-9)
    assert val["all_positions_acceptance_length"] == pytest.approx(evaluated["all_positions_acceptance_length"])


def test_training_lowers_val_loss_and_writes_a_valid_checkpoint(tiny_targets, tiny_data, tmp_path):
    cfg = config(tiny_targets["llama"], tiny_data, tmp_path / "run", epochs=6, val_every=10)
    trainer = Trainer(cfg)
    final = trainer.run()
    val = [r for r in read_metrics(tmp_path / "run") if r["split"] == "val"]
    assert val[0]["step"] == 0 and val[-1]["loss"] < val[0]["loss"]
    assert val[-1]["full_acc_0"] > val[0]["full_acc_0"]
    # the decoding walk on the validation split (engine.generate.acceptance), beside the per-token estimate
    assert all(1.0 <= r["walk_acceptance_length"] <= 1.0 + 3 for r in val)
    assert {"walk_best_k", "all_positions_acceptance_length"} <= set(val[-1])
    for r in val:  # the first-position gap: where drafts start against every position, both probabilities
        assert 0.0 <= r["walk_first_token_acceptance_at_draft_starts"] <= 1.0
        assert 0.0 <= r["walk_first_token_acceptance_all_positions"] <= 1.0
    _validation_walk_is_evaluates(trainer)
    train = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    assert {"loss", "full_acc_0", "cond_acc_2", "est_acceptance_length", "tokens_per_s", "lr"} <= set(train[-1])
    report = validate_draft(final)
    assert report.ok, report.errors
    names = set(tensor_index(final))
    assert "embed_tokens.weight" in names and "verifier_norm.weight" not in names  # speculators' layout (issue 18)
    assert not [w for w in report.warnings if w.field == "tensor:embed_tokens.weight"]
    assert {"fc.weight", "layers.0.hidden_norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert all(info.dtype == "BF16" for n, info in tensor_index(final).items() if n not in ("d2t", "t2d"))


def test_resume_mid_epoch_equals_uninterrupted(tiny_targets, tiny_data, tmp_path, monkeypatch):
    kw = dict(epochs=2, checkpoint_every=1000)
    Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "a", **kw)).run()
    full = Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "b", **kw))
    stop_at = full.total_steps // 3  # inside the first epoch
    assert 0 < stop_at < len(full.batches_for_epoch(0))
    original = Trainer._micro_step
    calls = {"n": 0}

    def interrupting(self, batch):
        calls["n"] += 1
        if calls["n"] > stop_at:
            raise KeyboardInterrupt  # what SIGTERM becomes in the CLI
        return original(self, batch)

    monkeypatch.setattr(Trainer, "_micro_step", interrupting)
    with pytest.raises(KeyboardInterrupt):
        full.run()
    state = json.loads(next((tmp_path / "b" / "checkpoints").glob("step_*/trainer_state/state.json")).read_text())
    assert state["reason"] == "interrupted" and state["step"] == stop_at and state["epoch"] == 0
    monkeypatch.setattr(Trainer, "_micro_step", original)
    Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "b", **kw)).run()
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "a" / "draft" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "draft" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("arch,draft_arch,layers", [("qwen3_moe", "llama", 1), ("qwen3", "qwen3", 2)])
def test_moe_and_multilayer_drafts_train(tiny_targets, tmp_path, arch, draft_arch, layers):
    data = extract(tiny_targets[arch], tmp_path / "hs", n=12)
    cfg = config(tiny_targets[arch], data, tmp_path / "run", max_steps=4, draft_arch=draft_arch, num_layers=layers)
    final = Trainer(cfg).run()
    report = validate_draft(final)
    assert report.ok, report.errors
    hf = report.vllm_hf_config
    assert hf["architectures"] == ["Eagle3Qwen3ForCausalLM" if draft_arch == "qwen3" else "Eagle3LlamaForCausalLM"]
    if layers == 2:
        assert "layers.1.self_attn.q_proj.weight" in tensor_index(final)


def test_online_training_runs_the_target_in_the_loop(tiny_targets, tmp_path):
    cfg = TrainConfig(target=str(tiny_targets["llama"]), online_dataset="sharegpt", online_max_samples=12,
                      out=str(tmp_path / "online"), max_steps=3, tokens_per_batch=256, max_length=160,
                      draft_vocab_size=128, warmup_steps=1, val_fraction=0.2)
    final = Trainer(cfg).run()
    rows = read_metrics(tmp_path / "online")
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3]
    assert validate_draft(final).ok


def test_ddp_two_processes_agree(tiny_targets, tiny_data, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "-m", "engine", "train", "--target", str(tiny_targets["llama"]), "--data", str(tiny_data),
           "--out", str(out), "--max-steps", "4", "--tokens-per-batch", "256", "--max-length", "160",
           "--draft-vocab-size", "128", "--warmup-steps", "1", "--val-fraction", "0.2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((out / "ddp_check.json").read_text())
    assert check["world"] == 2 and check["ranks_agree"] is True
    assert validate_draft(out / "draft").ok


def test_every_recipe_in_configs_loads():
    from engine.recipes.spec import load_recipe, step_commands

    recipes = sorted((ROOT / "configs").glob("*.yaml"))
    assert recipes
    for path in recipes:
        recipe = load_recipe(str(path))
        if "train" in recipe:
            cfg = TrainConfig(**{**recipe["train"], "data": "x"})
            assert cfg.algo == recipe["train"]["algo"] and cfg.algo_args.model_dump()  # typed by its algorithm
        assert step_commands(recipe)


def test_tiny_recipe_runs_every_step_and_writes_the_model_card(tiny_targets, tmp_path, monkeypatch):
    """extract -> train -> bench -> curve -> sweep -> ship on a tiny target; re-running skips finished steps."""
    import yaml

    from engine.recipes.model_card import sweep_from_card
    from engine.recipes.recipe import run_recipe

    monkeypatch.chdir(tmp_path)
    recipe = {
        "name": "tiny", "target": str(tiny_targets["llama"]), "work": str(tmp_path / "work"),
        "extract": {"dataset": "sharegpt", "algo": "eagle3", "max_samples": 16, "max_length": 128, "dtype": "bf16"},
        "train": {"algo": "eagle3", "draft_vocab_size": 128, "max_steps": 4, "tokens_per_batch": 256,
                  "max_length": 128, "warmup_steps": 1, "checkpoint_every": 2, "keep_checkpoints": 5,
                  "val_fraction": 0.2, "val_every": 2},
        "bench": {"prompts": "sharegpt", "num_prompts": 2, "max_new_tokens": 8, "k": 2, "methods": "baseline,draft"},
        "curve": {"num_prompts": 2, "max_new_tokens": 8, "k": 2},
        "sweep": {"num_prompts": 2, "max_new_tokens": 8, "ks": [1, 2], "max_rounds": 3},
        "evaluate": {"num_prompts": 2, "max_new_tokens": 8, "ks": [1, 2]},
        "ship": {"to": str(tmp_path / "shipped")},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    from engine import jobs
    from engine.cli import main

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    finished = []
    monkeypatch.setattr(jobs, "_REPORTER", jobs.Reporter(job_dir))
    monkeypatch.setattr(jobs.Reporter, "finish", lambda self, state="done", *a, **kw: finished.append(state))
    assert main(["recipe", str(path)]) == 0
    assert finished == ["done"]  # once, for the whole recipe: a finished step is not a finished job
    assert {p.stem for p in (tmp_path / "work" / "steps").glob("*.json")} == {"extract", "train", "bench"}
    shipped = tmp_path / "shipped"
    assert validate_draft(shipped).ok
    curve = json.loads((tmp_path / "work" / "curve.json").read_text())["rows"]
    assert [r["step"] for r in curve] == [2, 4] and curve[1]["training_tokens"] > curve[0]["training_tokens"] > 0
    swept = json.loads((tmp_path / "work" / "sweep.json").read_text())
    sweep = swept["rows"]
    assert [r["k"] for r in sweep] == [1, 2] and all(r["identical_to_baseline"] for r in sweep)
    assert 1 <= swept["rounds_kept"] <= len(swept["rounds"]) <= 3  # one speed per k, measured in rounds
    assert all(r["spread"]["n"] == swept["rounds_kept"] for r in sweep) and swept["methods"]["ngram"]["k"] == 2
    from engine.cpu import cpu_identity
    from engine.provenance import FIELDS

    for name in ("curve", "sweep", "evaluate", "bench", "steps/extract", "steps/train", "steps/bench"):
        record = json.loads((tmp_path / "work" / f"{name}.json").read_text())  # each names how it was made
        assert all(record[f] for f in FIELDS) and record["cpu_kind"] == cpu_identity()["cpu_kind"], name
        assert record["command"].startswith("python -m engine "), name
    for step in ("curve", "sweep", "evaluate"):  # the command that measures it again
        assert json.loads((tmp_path / "work" / f"{step}.json").read_text())["command"] == \
            f"python -m engine recipe tiny --only {step}"
    assert json.loads((tmp_path / "work" / "steps" / "extract.json").read_text())["dtype"] == "bf16"
    card = (shipped / "README.md").read_text()
    bench = json.loads((tmp_path / "work" / "bench.json").read_text())
    tau = bench["methods"]["draft"]["mean_acceptance_length"]
    assert f"Mean acceptance length **{tau:.2f}**" in card
    # the headline speed at the bench's k is the sweep's (same prompts): one speed per k in the whole card
    at_k = next(r for r in sweep if r["k"] == bench["k"])
    assert f"wall-clock speedup **{at_k['speedup']:.2f}×" in card
    assert [r["speedup"] for r in sweep_from_card(card)] == [round(r["speedup"], 2) for r in sweep]
    assert "| 4 |" in card and "### Number of speculative tokens (k)" in card
    assert "### Decoding-exact acceptance per k (offline evaluator)" in card and "forecast speedup" in card
    assert run_recipe(str(path))["timings"] == {}  # nothing changed: every step is skipped
    assert json.loads((tmp_path / "work" / "sweep.json").read_text())["rows"] == sweep  # measurements kept too

    from engine.recipes.recipe import k_sweep
    from engine.recipes.spec import load_recipe

    weights = tmp_path / "work" / "train" / "draft" / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # "trained again"
    again = k_sweep(load_recipe(str(path)))  # a validated recipe: its defaults filled
    assert [r["k"] for r in again["rows"]] == [1, 2] and again["weights"] != swept["weights"]

    from engine.errors import WorkbenchError
    from engine.recipes.recipe import remeasure  # the shipped draft measured again, its card updated in place
    from engine.recipes.spec import load_recipe

    done = remeasure(load_recipe(str(path)), only=["bench"])
    record = tmp_path / "work" / "remeasure" / "bench.json"
    fresh = json.loads(record.read_text())
    assert done["records"] == {"bench": str(record)} and fresh["methods"]["draft"]["identical_to_baseline"]
    assert fresh["command"].startswith(f"python -m engine bench --target {tiny_targets['llama']} --draft {shipped} ")
    text = (shipped / "README.md").read_text()
    assert text.count("## Results") == 1 and f"--draft {shipped} " in text
    assert "### Decoding-exact acceptance per k (offline evaluator)" in text  # the other sections stay
    stamp = record.stat().st_mtime_ns
    remeasure(load_recipe(str(path)), only=["bench"])
    assert record.stat().st_mtime_ns == stamp  # same weights: the record is reused
    with pytest.raises(WorkbenchError, match="cannot re-measure"):
        remeasure(load_recipe(str(path)), only=["train"])


def test_bad_config_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="give `data`"):
        TrainConfig()
    (tmp_path / "r.yaml").write_text("train:\n  lr: -1\n  data: x\n")
    with pytest.raises(Exception, match="lr"):
        TrainConfig.from_yaml(tmp_path / "r.yaml")
    proc = subprocess.run([sys.executable, "-m", "engine", "train", "--data", str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# -- compatibility with the reference implementation (speculators 0.9.0) ----------------------------


@pytest.mark.speculators
def test_speculators_loads_our_checkpoint_and_computes_the_same_logits(tiny_targets, tiny_data, tmp_path):
    pytest.importorskip("speculators")
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    from engine.algos.eagle3.io import load_eagle3, save_eagle3
    from engine.targets.loading import load_target

    target = load_target(str(tiny_targets["llama"]))
    final = Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "run", max_steps=5)).run()
    ours = load_eagle3(final, target)
    path = save_eagle3(ours, tmp_path / "fp32", dtype=torch.float32, include_embeddings=True)
    cfg = Eagle3SpeculatorConfig.from_pretrained(path)
    cfg.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
    ref = SpeculatorModel.from_pretrained(path, config=cfg).eval()
    t = 41
    torch.manual_seed(1)
    aux = torch.randn(1, t, ours.fc.in_features)
    ids = torch.randint(3, target.vocab_size, (1, t))
    doc = torch.zeros(1, t, dtype=torch.long)
    pos = 1 + torch.arange(t)[None]
    theirs: list[torch.Tensor] = []
    hook = ref.lm_head.register_forward_hook(lambda m, i, o: theirs.append(o.detach()))
    with torch.no_grad():
        ref(hidden_states=aux, input_ids=ids, document_ids=doc, position_ids=pos, ttt_steps=3)
        mine = ours.ttt_forward(aux, ids, pos, doc, 3)
    hook.remove()
    assert len(theirs) == 3
    for k in range(3):
        assert (theirs[k] - mine[k]).abs().max() <= 1e-4, k


@pytest.mark.speculators
def test_speculators_runs_a_draft_saved_exactly_as_we_ship_drafts(tiny_targets, tiny_data, tmp_path):
    """The trainer's own `draft/` folder (bf16, defaults), not a re-save: speculators computes our logits.

    The same draft with one weight changed shows that the comparison can fail. Without embed_tokens speculators
    0.9.0 fills the embedding with random values, or with the verifier's when the memory it got held NaN (issue
    18; which one depends on the allocator): `validate` warns about such a draft."""
    pytest.importorskip("speculators")
    from engine.algos.eagle3.io import load_eagle3
    from engine.targets.loading import load_target
    from speculators_ref import load_reference, logit_gaps

    target = load_target(str(tiny_targets["llama"]))
    shipped = Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "run", max_steps=2)).run()
    slim = Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "slim", max_steps=2,
                          save_embeddings=False)).run()
    assert "embed_tokens.weight" in tensor_index(shipped) and "embed_tokens.weight" not in tensor_index(slim)
    assert [w.field for w in validate_draft(slim).warnings if "speculators 0.9.0" in w.message] == \
        ["tensor:embed_tokens.weight"]

    def gap(folder: Path, ours_from: Path | None = None) -> float:
        ours = load_eagle3(ours_from or folder, target)  # fp32 copies of the bf16 values
        return max(logit_gaps(load_reference(folder), ours, target.vocab_size, tokens=29, steps=2))

    same = gap(shipped)
    assert same <= 1e-4
    from safetensors.torch import load_file, save_file

    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "config.json").write_text((shipped / "config.json").read_text())
    tensors = load_file(str(shipped / "model.safetensors"))
    tensors["fc.weight"] = -tensors["fc.weight"]  # a draft that computes other logits
    save_file(tensors, str(changed / "model.safetensors"))
    assert gap(changed, ours_from=shipped) > 1e-2  # speculators on other weights: the comparison catches it


@pytest.mark.speculators
def test_a_checkpoint_speculators_wrote_runs_in_our_model(tiny_targets, tmp_path):
    pytest.importorskip("speculators")
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    from engine.algos.eagle3.io import load_eagle3
    from engine.targets.loading import load_target

    verifier_dir = str(tiny_targets["llama"])
    layer_cfg = AutoConfig.from_pretrained(verifier_dir)
    layer_cfg.num_hidden_layers = 1
    layer_cfg._attn_implementation = "eager"
    spec_cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg, draft_vocab_size=layer_cfg.vocab_size, norm_before_residual=True,
        norm_before_fc=True, norm_output=True, eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(verifier_dir)))
    torch.manual_seed(0)
    ref = Eagle3DraftModel(config=spec_cfg)
    ref.load_verifier_weights()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.uniform_(0.5, 1.5)  # make norms non-trivial so a mix-up would show
    ref.eval()
    ref.save_pretrained(tmp_path / "spec")
    report = validate_draft(tmp_path / "spec")
    assert report.vllm_ok, report.errors
    ours = load_eagle3(tmp_path / "spec", load_target(verifier_dir))
    t = 23
    aux = torch.randn(1, t, ours.fc.in_features)
    ids = torch.randint(3, layer_cfg.vocab_size, (1, t))
    doc = torch.zeros(1, t, dtype=torch.long)
    pos = 1 + torch.arange(t)[None]
    theirs: list[torch.Tensor] = []
    ref.lm_head.register_forward_hook(lambda m, i, o: theirs.append(o.detach()))
    with torch.no_grad():
        ref(hidden_states=aux, input_ids=ids, document_ids=doc, position_ids=pos, ttt_steps=2)
        mine = ours.ttt_forward(aux, ids, pos, doc, 2)
    for k in range(2):
        assert (theirs[k] - mine[k]).abs().max() <= 1e-4, k


def test_packed_documents_do_not_see_each_other(tiny_llama):
    """A packed row gives each document exactly the logits it gets alone (document masks work)."""
    from engine.algos.eagle3.io import build_eagle3

    draft = build_eagle3(tiny_llama, aux_layer_ids=[1, 2, 3]).eval()
    torch.manual_seed(0)
    lengths = [7, 12, 5]
    docs = [(torch.randn(1, n, draft.fc.in_features), torch.randint(3, 300, (1, n))) for n in lengths]
    aux = torch.cat([a for a, _ in docs], dim=1)
    ids = torch.cat([i for _, i in docs], dim=1)
    pos = torch.cat([torch.arange(1, n + 1) for n in lengths])[None]
    doc = torch.cat([torch.full((n,), j) for j, n in enumerate(lengths)])[None]
    with torch.no_grad():
        packed = draft.ttt_forward(aux, ids, pos, doc, 2)
        start = 0
        for (a, i), n in zip(docs, lengths, strict=True):
            alone = draft.ttt_forward(a, i, torch.arange(1, n + 1)[None], torch.zeros(1, n, dtype=torch.long), 2)
            # step 0 is fully independent; later steps read tokens shifted across the boundary only at the
            # last positions of a document, which the loss masks out (engine.algos.eagle3.train)
            torch.testing.assert_close(packed[0][:, start:start + n], alone[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(packed[1][:, start:start + n - 1], alone[1][:, : n - 1], rtol=1e-5, atol=1e-5)
            start += n


def test_a_recipe_borrowing_data_trains_on_the_lenders_hidden_states_and_shares_its_step_markers(tmp_path, caplog):
    """`data: <recipe>`: the lender's regenerate/extract steps (its markers, its folders), our train step on them."""
    import yaml

    from engine.errors import WorkbenchError
    from engine.recipes.model_card import gather
    from engine.recipes.recipe import _digest, run_recipe
    from engine.recipes.spec import cli_flags, load_recipe, step_options

    lender = {"name": "lender", "work": str(tmp_path / "lender"),
              "extract": {"dataset": "sharegpt", "algo": "dflash", "max_samples": 4}}
    (tmp_path / "lender.yaml").write_text(yaml.safe_dump(lender))
    borrower = {"name": "borrower", "work": str(tmp_path / "borrower"), "data": str(tmp_path / "lender.yaml"),
                "train": {"algo": "dspark", "max_steps": 1}}
    (tmp_path / "borrower.yaml").write_text(yaml.safe_dump(borrower))
    steps = dict(step_options(load_recipe(str(tmp_path / "borrower.yaml"))))
    assert list(steps) == ["extract", "train"]
    assert steps["extract"]["out"] == steps["train"]["data"] == str(tmp_path / "lender" / "hidden")
    assert steps["train"]["out"] == str(tmp_path / "borrower" / "train")

    # the lender's extraction is done: the borrower's run skips it (a dry run prints only what it would run)
    markers = tmp_path / "lender" / "steps"
    markers.mkdir(parents=True)
    (markers / "extract.json").write_text(json.dumps(
        {"digest": _digest(["extract", *cli_flags(steps["extract"])]), "seconds": 12.0}))
    (tmp_path / "lender" / "hidden").mkdir()
    (tmp_path / "lender" / "hidden" / "manifest.json").write_text(json.dumps({"samples": 4, "layer_ids": [1, 2]}))
    with caplog.at_level(logging.INFO, logger="engine.recipes.recipe"):
        run_recipe(str(tmp_path / "borrower.yaml"), dry_run=True)
    assert "== train:" in caplog.text and "== extract:" not in caplog.text
    facts = gather(load_recipe(str(tmp_path / "borrower.yaml")))
    assert facts["manifest"]["samples"] == 4 and facts["steps"]["extract"]["seconds"] == 12.0  # the card's data

    (tmp_path / "both.yaml").write_text(yaml.safe_dump({**borrower, "extract": lender["extract"]}))
    with pytest.raises(WorkbenchError, match="cannot have its own regenerate or extract"):
        load_recipe(str(tmp_path / "both.yaml"))


def test_model_card_shows_the_vllm_bench_and_says_by_how_much_a_recipe_goal_is_missed(tmp_path):
    """The card's vLLM table comes from the recipe's vllm_bench.json; a missed vLLM goal is named with the gap."""
    from engine.recipes.model_card import gather, render

    work = tmp_path / "work"
    (work / "train" / "draft").mkdir(parents=True)
    (work / "train" / "draft" / "config.json").write_text(json.dumps(
        {"aux_hidden_state_layer_ids": [2, 9], "block_size": 8, "mask_token_id": 2,
         "transformer_layer_config": {"num_hidden_layers": 2, "hidden_size": 576}}))
    (work / "train" / "config.yaml").write_text("train:\n  algo: dflash\n  algo_args:\n    block_size: 8\n")
    draft = {"mean_acceptance_length": 1.33, "per_position_acceptance": [0.28, 0.04, 0.01], "tokens_per_s": 14.0,
             "speedup": 0.8, "identical_to_baseline": True}
    (work / "bench.json").write_text(json.dumps({"k": 3, "num_prompts": 20, "max_new_tokens": 128, "methods": {
        "baseline": {"mean_acceptance_length": None, "per_position_acceptance": [], "tokens_per_s": 17.5,
                     "speedup": 1.0, "identical_to_baseline": True}, "draft": draft}}))
    (work / "vllm_bench.json").write_text(json.dumps({"k": 3, "dtype": "bfloat16", "methods": {
        "baseline": {"tokens_per_s": 35.0, "speedup": 1.0},
        "draft": {"mean_acceptance_length": 1.35, "per_position_acceptance": [0.3, 0.04, 0.01],
                  "tokens_per_s": 37.1, "speedup": 1.06}}}))
    recipe = {"name": "r", "work": str(work), "ship": {"to": "assets/drafts/x"},
              "goals": {"vllm_speedup": 1.15, "vllm_speedup_why": ", the other draft's"}}
    card = render(recipe, gather(recipe))
    assert "# SmolLM2-135M-Instruct DFlash draft" in card and "A DFlash draft model" in card
    assert "block of 8 (the last token and mask token 2" in card  # the algorithm's own model description
    assert "### In real vLLM" in card and "| draft | 1.35 | 0.30, 0.04, 0.01 | 37.1 | 1.06× |" in card
    assert "≥ 1.15× in real vLLM on this CPU, the other draft's (this draft: 1.06×, short by 0.09)" in card
    assert "**In vLLM** a speculative step costs 1.27 plain steps" in card


@pytest.mark.parametrize("algo,gpu_only", [("dflash", False), ("dflash2", True), ("dspark", True)])
def test_a_cards_serving_lines_say_where_vllm_serves_the_type(tmp_path, algo, gpu_only):
    """A type vLLM's CPU build refuses at start gets a card that says so with vLLM's words, and an in-process
    command; the others are served directly."""
    from engine.algos import ALGOS
    from engine.recipes.model_card import gather, render

    work = tmp_path / "work"
    (work / "train" / "draft").mkdir(parents=True)
    (work / "train" / "draft" / "config.json").write_text(json.dumps(
        {"aux_hidden_state_layer_ids": [2, 9], "block_size": 8, "mask_token_id": 2,
         "transformer_layer_config": {"num_hidden_layers": 2, "hidden_size": 576}}))
    (work / "train" / "config.yaml").write_text(f"train:\n  algo: {algo}\n  algo_args:\n    block_size: 8\n")
    card = render({"name": "r", "work": str(work), "ship": {"to": "assets/drafts/x"}},
                  gather({"name": "r", "work": str(work), "ship": {"to": "assets/drafts/x"}}))
    refusal = ALGOS.get(algo).config_class.vllm_cpu_refusal
    assert (refusal is not None) == gpu_only
    if gpu_only:
        assert f"its CPU build refuses it at start ('{refusal}')" in card and "vLLM serves it directly" not in card
        assert "python -m engine bench --draft assets/drafts/x" in card
    else:
        assert "vLLM serves it directly:" in card and "python -m engine serve --draft assets/drafts/x" in card


def test_ship_refuses_a_destination_holding_files_the_workbench_did_not_write(tmp_path):
    from engine.errors import WorkbenchError
    from engine.recipes.recipe import ship

    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("the user's")
    (dest / "config.json").write_text("{}")
    with pytest.raises(WorkbenchError, match="did not write"):
        ship({"name": "r", "work": str(tmp_path / "work"), "ship": {"to": str(dest)}})
    assert (dest / "notes.txt").read_text() == "the user's" and (dest / "config.json").read_text() == "{}"
    from engine.fsutil import claim_names

    ours = tmp_path / "shipped-before"  # an earlier ship's folder, plus weights a user put beside them
    claim_names(ours, ["config.json", "model.safetensors", "README.md"], kind="shipped-draft")
    (ours / "model.safetensors").write_bytes(b"ours")
    (ours / "extra.safetensors").write_bytes(b"the user's")
    with pytest.raises(WorkbenchError, match="extra.safetensors"):
        ship({"name": "r", "work": str(tmp_path / "work"), "ship": {"to": str(ours)}})
    assert (ours / "extra.safetensors").read_bytes() == b"the user's" and (ours / "model.safetensors").exists()


def test_ship_sets_the_embedding_apart_and_replaces_only_the_old_layout_it_wrote(tiny_llama, tmp_path, monkeypatch):
    """A re-ship over the old single-file layout: the verifier's embedding in a shard of its own, the old
    model.safetensors removed and no longer recorded as ours; the draft reads back as trained."""
    from engine.algos import ALGOS
    from engine.algos.eagle3.args import Eagle3Args
    from engine.format.checkpoint import load_state_dict
    from engine.fsutil import OWNER_MARKER, claim_names
    from engine.recipes import model_card
    from engine.recipes.recipe import ship

    algo = ALGOS.get("eagle3")
    draft = algo.build(tiny_llama, Eagle3Args(), aux_layer_ids=[1, 2, 3], token_counts=None, seed=0)
    trained = algo.save(draft, tmp_path / "work" / "train" / "draft")
    dest = tmp_path / "shipped"
    claim_names(dest, ["config.json", "model.safetensors", "README.md"], kind="shipped-draft")
    for name in ("config.json", "model.safetensors", "README.md"):
        (dest / name).write_text("the previous ship's")
    monkeypatch.setattr(model_card, "write_model_card",
                        lambda recipe, folder: (folder / "README.md").write_text("card"))
    ship({"name": "r", "work": str(tmp_path / "work"), "ship": {"to": str(dest)}})

    index = json.loads((dest / "model.safetensors.index.json").read_text())["weight_map"]
    embed_shard = index.pop("embed_tokens.weight")
    assert embed_shard not in index.values()  # a shard of its own
    assert set(tensor_index(dest)) == set(tensor_index(trained)) and not (dest / "model.safetensors").exists()
    back, want = load_state_dict(dest), load_state_dict(trained)
    assert all(torch.equal(back[k], want[k]) for k in want)
    files = {p.name for p in dest.iterdir()} - {OWNER_MARKER}
    assert set(json.loads((dest / OWNER_MARKER).read_text())["files"]) == files
    assert "model.safetensors" not in files and validate_draft(dest).ok


def test_remeasured_figures_replace_the_old_ones_in_a_shipped_card_and_keep_its_training_sections(tmp_path):
    """The shipped EAGLE-3 card as it was (fp32 figures), refreshed from new bench, vLLM and sweep records."""
    from engine.recipes.model_card import refresh_measurements

    card = tmp_path / "README.md"
    card.write_text((ROOT / "tests" / "fixtures" / "card-eagle3-fp32.md").read_text())
    row = {"mean_acceptance_length": 1.51, "per_position_acceptance": [0.33, 0.13, 0.05], "tokens_per_s": 35.6,
           "speedup": 1.13, "identical_to_baseline": True, "draft_fraction": 0.16, "overhead_fraction": 0.01,
           "speedup_ceiling": 1.37}
    bench = {"k": 3, "num_prompts": 20, "max_new_tokens": 128, "target_dtype": "bf16", "threads": 2,
             "cost_curve": {"1": 1.0, "4": 1.10}, "command": "python -m engine bench --draft D --dtype auto",
             "methods": {"baseline": {"mean_acceptance_length": None, "per_position_acceptance": [],
                                      "tokens_per_s": 31.6, "speedup": 1.0, "identical_to_baseline": True},
                         "draft": row}}
    vllm = {"k": 3, "dtype": "bfloat16", "command": "python -m engine bench --backend vllm", "methods": {
        "baseline": {"tokens_per_s": 35.0, "speedup": 1.0},
        "draft": {"mean_acceptance_length": 1.52, "per_position_acceptance": [0.35, 0.12, 0.05],
                  "tokens_per_s": 40.2, "speedup": 1.15}}}
    sweep = [{"k": k, "mean_acceptance_length": 1.3 + 0.1 * k, "per_position_acceptance": [0.3] * k,
              "speedup": 1.0 + 0.05 * k, "identical_to_baseline": True, "num_prompts": 10, "max_new_tokens": 128}
             for k in (1, 2)]
    recipe = {"name": "smollm2-eagle3", "work": "runs/recipes/smollm2-eagle3",
              "ship": {"to": "assets/drafts/smollm2-135m-instruct-eagle3"},
              "goals": {"mean_acceptance_length": 2.0, "speedup": 1.1, "vllm_speedup": 1.35}}
    data = [{"recipe": "smollm2-eagle3", "algorithm": "eagle3", "conversations": 2689, "assistant_tokens": 534985,
             "training_tokens": 2219535, "mean_acceptance_length": 1.579, "target_dtype": "bf16"}]
    refresh_measurements(card, recipe, bench=bench, vllm_bench=vllm, sweep=sweep, data=data)
    text = card.read_text()
    assert "0.81×" not in text and "| draft | 1.55 | 0.35, 0.14, 0.06 | 14.0 |" not in text  # old figures gone
    assert "in-process engine (bf16 target, 2 threads)" in text and "wall-clock speedup **1.13×**" in text
    assert "| draft | 1.52 | 0.35, 0.12, 0.05 | 40.2 | 1.15× |" in text  # the vLLM table, added
    assert "| 2 | 1.50 | 0.30, 0.30 | 1.10× | yes |" in text and "| 5 | 1.51 |" not in text  # sweep replaced
    assert "569 optimizer steps" in text and "| 300 | 1169k | 1.39 |" in text  # training sections kept
    assert ("Goals missed: a mean acceptance length ≥ 2.0 at k = 3 (this draft: 1.51, short by 0.49); ≥ 1.35× in "
            "real vLLM on this CPU (this draft: 1.15×, short by 0.20).") in text  # 1.13× meets the 1.1× goal
    assert "A speculative step costs 1.34 baseline steps here (bf16 target" in text
    assert "**In vLLM** a speculative step costs 1.32 plain steps" in text and "- **Data.** 2,689" in text
    assert "in decoding, position 0 is accepted 0.33 of the time" in text  # the new bench's figure
    assert text.count("## Results") == 1 and text.count("### In real vLLM") == 1
    assert text.rstrip().endswith("--remeasure` (on the shipped files); the training sections are as trained.")
    assert "| `smollm2-eagle3` | eagle3 | 2,689 | 534,985 | 2.22M | 1.579 | bf16 |" in text  # acceptance vs data
    assert text.index("### Acceptance against data") < text.index("### Number of speculative tokens")
    refresh_measurements(card, recipe, bench=bench, vllm_bench=vllm, sweep=sweep, data=data)
    assert card.read_text() == text  # in place: refreshing twice changes nothing


def test_a_remeasure_here_keeps_what_it_did_not_measure_and_describes_the_files_as_they_are(tmp_path):
    """Re-measuring bench/evaluate/sweep on a machine without the other recipes' work folders keeps their rows of
    the acceptance-against-data table, judges the vLLM goal on the kept vLLM record, and rewrites the model bullets
    (a repaired draft stores its embedding)."""
    from engine.recipes.model_card import refresh_measurements

    card = tmp_path / "README.md"
    card.write_text((ROOT / "assets" / "drafts" / "smollm2-135m-instruct-eagle3" / "README.md").read_text())
    before = card.read_text()
    other_rows = [line for line in before.splitlines() if line.startswith("| `smollm2-") and "eagle3" not in line]
    assert len(other_rows) == 3  # dflash, dspark, peagle, measured on another machine
    row = {"mean_acceptance_length": 1.6, "per_position_acceptance": [0.4, 0.15, 0.05], "tokens_per_s": 40.0,
           "speedup": 1.2, "identical_to_baseline": True, "draft_fraction": 0.13, "overhead_fraction": 0.01}
    bench = {"k": 3, "num_prompts": 20, "max_new_tokens": 128, "target_dtype": "bf16", "threads": 2,
             "cost_curve": {"1": 1.0, "4": 1.09}, "command": "python -m engine bench --draft D --dtype auto",
             "methods": {"baseline": {"mean_acceptance_length": None, "per_position_acceptance": [],
                                      "tokens_per_s": 33.0, "speedup": 1.0, "identical_to_baseline": True},
                         "draft": row}}
    kept_vllm = {"methods": {"draft": {"mean_acceptance_length": 1.55, "speedup": 1.16}}}
    recipe = {"name": "smollm2-eagle3", "work": "w", "ship": {"to": "d"},
              "goals": {"mean_acceptance_length": 2.0, "speedup": 1.1, "vllm_speedup": 1.35}}
    data = [{"recipe": "smollm2-eagle3", "algorithm": "eagle3", "conversations": 2689, "assistant_tokens": 534985,
             "training_tokens": 2219535, "mean_acceptance_length": 1.6, "target_dtype": "bf16"}]
    refresh_measurements(card, recipe, bench=bench, data=data, vllm_goals=kept_vllm,
                         model_lines=["- a new model bullet"])
    text = card.read_text()
    assert all(line in text for line in other_rows)
    assert "| `smollm2-eagle3` | eagle3 | 2,689 | 534,985 | 2.22M | 1.600 | bf16 |" in text
    assert "≥ 1.35× in real vLLM on this CPU (this draft: 1.16×, short by 0.19)" in text
    vllm_row = next(x for x in before[before.index("### In real vLLM"):].splitlines() if x.startswith("| draft |"))
    assert "### In real vLLM" in text and vllm_row in text  # the vLLM table as it was measured
    model = text[text.index("## Model"):text.index("## Data")]
    assert "- a new model bullet" in model and "- Target weights" in model and "not stored" not in model


def test_raising_a_recipes_sample_count_regenerates_and_extracts_only_the_new_rows(tiny_targets, tmp_path):
    """Data that grows across runs (issue 20): the finished rows and sample files are kept, byte for byte."""
    import yaml

    from engine.recipes.recipe import run_recipe

    work = tmp_path / "work"
    recipe = {"name": "grow", "target": str(tiny_targets["llama"]), "work": str(work),
              "regenerate": {"dataset": "sharegpt", "split": "train", "max_samples": 3, "max_turns": 1,
                             "max_new_tokens": 4, "max_length": 1024, "backend": "transformers", "batch_size": 4},
              "extract": {"algo": "eagle3", "max_length": 1024, "dtype": "bf16"},
              "train": {"algo": "eagle3", "draft_vocab_size": 64, "max_steps": 2, "tokens_per_batch": 128,
                        "max_length": 1024, "warmup_steps": 1, "checkpoint_every": 1, "val_fraction": 0.0}}
    path = tmp_path / "grow.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_recipe(str(path))
    lines = (work / "regenerated.jsonl").read_text().splitlines()
    files = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (work / "hidden").glob("hs_*")}
    assert len(lines) == 3 and len(files) == 3

    recipe["regenerate"]["max_samples"] = 5
    path.write_text(yaml.safe_dump(recipe))
    # regenerate's options changed; extract and train read more data than their markers recorded
    assert set(run_recipe(str(path))["timings"]) == {"regenerate", "extract", "train"}
    assert json.loads((work / "steps" / "train.json").read_text())["inputs"] == {"data_samples": 5}
    grown = (work / "regenerated.jsonl").read_text().splitlines()
    assert len(grown) == 5 and grown[:3] == lines  # the first answers were not generated again
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (work / "hidden").glob("hs_*")}
    assert len(after) == 5 and all(after[name] == files[name] for name in files)  # old samples untouched
    manifest = json.loads((work / "hidden" / "manifest.json").read_text())
    assert manifest["samples"] == 5


def test_a_draft_whose_training_records_are_gone_gets_its_data_point_from_its_card(tmp_path):
    from engine.recipes.model_card import data_point

    ship = tmp_path / "shipped"
    ship.mkdir()
    (ship / "README.md").write_text((ROOT / "tests" / "fixtures" / "card-eagle3-fp32.md").read_text())
    (ship / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    recipe = {"name": "old", "work": str(tmp_path / "work"), "ship": {"to": str(ship)}}
    assert data_point(recipe) is None  # never evaluated: no row
    (tmp_path / "work" / "remeasure").mkdir(parents=True)
    (tmp_path / "work" / "remeasure" / "evaluate.json").write_text(json.dumps(
        {"held_out_prompts": 20, "target_dtype": "bf16", "by_k": {"3": {"mean_acceptance_length": 1.58}}}))
    row = data_point(recipe)
    assert (row["conversations"], row["assistant_tokens"], row["training_tokens"]) == (2689, 534985, 2219535)
    assert row["mean_acceptance_length"] == 1.58 and row["algorithm"] == "eagle3" and row["target_dtype"] == "bf16"


@pytest.mark.parametrize("precision,autocast", [("bf16", True), ("fp32", False), ("auto", False)])
def test_cpu_precision_bf16_trains_under_bf16_autocast(tiny_targets, tiny_data, tmp_path, precision, autocast):
    """`--precision bf16` on a CPU computes under bf16 autocast (it used to be ignored off CUDA); fp32 and auto do not;
    the weights stay fp32 either way and the run learns."""
    trainer = Trainer(config(tiny_targets["llama"], tiny_data, tmp_path / "run", max_steps=3, precision=precision,
                             device="cpu"))
    seen = []

    class Watched:  # the objective, noting the autocast state it runs under
        def __init__(self, objective):
            self.objective = objective

        def __call__(self, model, batch):
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            return self.objective(model, batch)

        def __getattr__(self, name):
            return getattr(self.objective, name)

    trainer.objective = Watched(trainer.objective)
    trainer.run()
    assert seen and all(enabled == autocast for enabled, _ in seen)
    assert all(dtype == torch.bfloat16 for enabled, dtype in seen if enabled)
    assert all(p.dtype == torch.float32 for p in trainer.draft.parameters())
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in read_metrics(tmp_path / "run") if r["split"] == "train")


def test_a_data_goal_is_judged_against_the_conversations_the_card_says_the_draft_trained_on(tmp_path):
    """`goals: conversations:` is missed with the factor still to go, read from the card's hidden-states line;
    a draft trained on enough data misses nothing on that count."""
    from engine.recipes.model_card import card_conversations, missed_goals

    lines = (ROOT / "tests" / "fixtures" / "card-eagle3-fp32.md").read_text().splitlines()
    assert card_conversations(lines) == 2689
    bench = {"k": 3, "methods": {"draft": {"mean_acceptance_length": 1.9, "speedup": 1.2}}}
    goals = {"mean_acceptance_length": 1.8, "speedup": 1.1, "conversations": 10756}
    assert missed_goals(bench, {}, goals, 2689) == [
        "training data of ≥ 10,756 conversations (this draft: 2,689, 4.0× short)"]
    assert missed_goals(bench, {}, goals, 10756) == []
    assert card_conversations(["## Data", "- Prompts: 12 conversations"]) is None


def test_a_reship_keeps_the_cards_rows_of_recipes_measured_on_other_machines(tmp_path, monkeypatch):
    """The acceptance-against-data table of a new card: this recipe's row from its records, the other recipes' rows
    from the card it replaces (their work folders are not on this machine)."""
    from engine.recipes import model_card

    dest = tmp_path / "shipped"
    dest.mkdir()
    other = "| `smollm2-dflash` | dflash | 2,688 | 536,000 | 2.23M | 1.371 | bf16 |"
    (dest / "README.md").write_text("\n".join([
        model_card.DATA_HEADING, "", "", "| recipe | algorithm | conversations | assistant tokens | training tokens "
        "| τ at k = 3 | target |", "|---|---|---|---|---|---|---|", other,
        "| `smollm2-eagle3` | eagle3 | 2,689 | 534,985 | 2.22M | 1.539 | bf16 |", ""]))
    here = {"recipe": "smollm2-eagle3", "algorithm": "eagle3", "conversations": 10774, "assistant_tokens": 2160059,
            "training_tokens": 2975625, "mean_acceptance_length": 1.713, "target_dtype": "bf16"}
    monkeypatch.setattr(model_card, "data_rows", lambda target: [here])
    card = model_card.write_model_card({"name": "smollm2-eagle3", "work": str(tmp_path / "work"),
                                        "ship": {"to": str(dest)}}, dest).read_text()
    assert other in card and "| `smollm2-eagle3` | eagle3 | 10,774 | 2,160,059 | 2.98M | 1.713 | bf16 |" in card
    assert "534,985" not in card  # this recipe's old row is replaced, not kept
