"""llama.cpp as an engine, without running it: which draft types it runs and why not, the layout its converter reads,
the server's plan and what it refuses, and the options of serve and bench that name it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

import engine.algos  # noqa: F401
from engine.algos.dflash.llamacpp_form import form_problem, zlab_config
from engine.errors import WorkbenchError
from engine.format.config import CONFIG_TYPES, config_type
from engine.llamacpp.gguf import check_out, draft_k, spec_type_of
from engine.llamacpp.server import LlamaPlan, check_spec_types
from engine.measure.llamacpp_bench import method_plan, ngram_args
from engine.measure.options import BenchOptions
from engine.serve.options import ServeOptions

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {name: ROOT / "assets" / "drafts" / f"smollm2-135m-instruct-{name}"
           for name in ("eagle3", "dflash", "dflash2")}


def _cfg(name: str) -> dict:
    return json.loads((SHIPPED[name] / "config.json").read_text())


def test_every_registered_type_says_whether_llama_cpp_runs_it():
    expected = {"eagle3": "draft-eagle3", "dflash": "draft-dflash", "dflash2": "draft-dflash", "dspark": "draft-dspark",
                "peagle": None}
    for algo in CONFIG_TYPES.names():
        cls = config_type(algo)
        assert cls.llamacpp_spec_type == expected[algo], algo
        if cls.llamacpp_spec_type is None:
            assert "P-EAGLE" in cls.llamacpp_problem({}) or "parallel" in cls.llamacpp_problem({})


def test_a_type_llama_cpp_does_not_run_is_refused_with_the_reason():
    with pytest.raises(WorkbenchError, match="parallel-drafting EAGLE"):
        spec_type_of({"speculators_model_type": "peagle"})
    cfg = {**_cfg("dflash"), "sample_from_anchor": True}
    with pytest.raises(WorkbenchError, match="sample_from_anchor"):
        spec_type_of(cfg)


def test_an_eagle3_draft_of_other_than_three_target_layers_is_refused():
    cfg = {**_cfg("eagle3"), "eagle_aux_hidden_state_layer_ids": [1, 2]}
    with pytest.raises(WorkbenchError, match="reads 2 target layers.*exactly 3"):
        spec_type_of(cfg)


def test_the_shipped_drafts_map_to_their_spec_type_and_k():
    assert {n: spec_type_of(_cfg(n)) for n in SHIPPED} == {"eagle3": "draft-eagle3", "dflash": "draft-dflash",
                                                           "dflash2": "draft-dflash"}
    assert draft_k(_cfg("eagle3")) == _cfg("eagle3")["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


def test_zlab_form_shifts_layer_ids_and_keeps_the_block_and_causality():
    cfg = _cfg("dflash2")
    z = zlab_config(cfg, "DFlash2DraftModel", config_type("dflash2").llamacpp_dflash_fields(cfg))
    assert z["architectures"] == ["DFlash2DraftModel"] and z["model_type"] == "qwen3"
    assert z["dflash_config"]["target_layer_ids"] == [i - 1 for i in cfg["aux_hidden_state_layer_ids"]]
    assert z["dflash_config"]["mask_token_id"] == cfg["mask_token_id"] == z["dflash_config"]["mask_token_id"]
    assert z["block_size"] == z["dflash_config"]["block_size"] == cfg["block_size"]
    assert z["is_causal"] is (not cfg["sliding_window_non_causal"])
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        assert z["dflash_config"][key] == cfg[key]
    assert z["hidden_size"] == cfg["transformer_layer_config"]["hidden_size"]
    assert "selector_rank" not in zlab_config(_cfg("dflash"), "DFlashDraftModel")["dflash_config"]


def test_form_problems_name_what_llama_cpp_cannot_run():
    cfg = _cfg("dflash")
    assert form_problem(cfg) is None
    assert "d2t" in form_problem({**cfg, "draft_vocab_size": 8192})
    llama = {**cfg, "transformer_layer_config": {**cfg["transformer_layer_config"], "model_type": "llama"}}
    assert "Qwen3" in form_problem(llama)
    dspark = config_type("dspark")
    assert "vanilla" in dspark.llamacpp_problem({**cfg, "markov_head_type": "gated"})
    gemma = {**cfg, "transformer_layer_config": {**cfg["transformer_layer_config"], "model_type": "gemma4_text"}}
    assert "Qwen3 backbone" in dspark.llamacpp_problem(gemma)


def test_the_zlab_form_links_the_weights_and_writes_the_config(tmp_path):
    out = config_type("dflash").write_llamacpp_form(_cfg("dflash"), SHIPPED["dflash"], tmp_path / "form")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    weights = out / "model.safetensors"
    assert weights.exists() and weights.resolve() == (SHIPPED["dflash"] / "model.safetensors").resolve()
    assert config_type("eagle3").write_llamacpp_form(_cfg("eagle3"), SHIPPED["eagle3"], tmp_path / "e") is None


@pytest.mark.parametrize("types, has_draft, error", [
    (("ngram-fancy",), False, "unknown llama.cpp speculative type"),
    (("draft-eagle3", "draft-dflash"), True, "one draft type"),
    (("draft-eagle3",), False, "needs a draft model"),
    (("ngram-mod",), True, "no draft type"),
])
def test_the_plan_refuses_what_llama_server_would(types, has_draft, error):
    with pytest.raises(WorkbenchError, match=error):
        check_spec_types(types, has_draft=has_draft)


def test_the_plan_spells_llama_servers_flags():
    plan = LlamaPlan(Path("t.gguf"), Path("d.gguf"), ("draft-eagle3", "ngram-mod"), k=3, p_min=0.6)
    assert plan.args() == ["-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-eagle3,ngram-mod",
                           "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.6"]
    assert LlamaPlan(Path("t.gguf")).args() == ["-m", "t.gguf"]
    with pytest.raises(WorkbenchError, match="not a probability"):
        LlamaPlan(Path("t.gguf"), Path("d.gguf"), ("draft-eagle3",), p_min=1.5)


def test_bench_methods_become_llama_server_plans():
    class Exported:
        path, spec_type, draft = Path("d.gguf"), "draft-dflash", "drafts/x"

    t = Path("t.gguf")
    assert method_plan("baseline", target=t, draft=None, k=3, p_min=None).spec_types == ()
    ngram = method_plan("ngram", target=t, draft=None, k=3, p_min=None)
    assert ngram.spec_types == ("ngram-simple",) and ngram.extra_args == ngram_args(3)
    assert ngram_args(1) == ("--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "1")  # m >= n
    assert method_plan("draft_ngram", target=t, draft=Exported, k=5, p_min=0.5).spec_types == ("draft-dflash",
                                                                                               "ngram-mod")
    with pytest.raises(WorkbenchError, match="needs a draft"):
        method_plan("draft", target=t, draft=None, k=3, p_min=None)


def test_serve_refuses_flags_of_the_other_engine():
    with pytest.raises(ValidationError, match="--dtype apply to --engine vllm"):
        ServeOptions(engine="llama.cpp", dtype="float32")
    with pytest.raises(ValidationError, match="--p-min apply to --engine llama.cpp"):
        ServeOptions(p_min=0.5)
    assert ServeOptions(engine="llama.cpp", p_min=0.5, ngram="ngram-mod").argv("serve") == [
        "serve", "--engine", "llama.cpp", "--p-min", "0.5", "--ngram", "ngram-mod"]


def test_bench_runs_draft_ngram_in_process_and_in_llama_cpp_not_in_vllm():
    assert BenchOptions(backend="llama.cpp").method_names() == ("baseline", "draft", "ngram", "draft_ngram")
    assert BenchOptions(methods="baseline,draft_ngram").method_names() == ("baseline", "draft_ngram")
    with pytest.raises(WorkbenchError, match="vllm backend does not run draft_ngram"):
        BenchOptions(methods="baseline,draft_ngram", backend="vllm").method_names()
    with pytest.raises(WorkbenchError, match="in-process only"):
        BenchOptions(backend="llama.cpp", ks="1-3")
    assert "draft_ngram" not in BenchOptions().method_names()


def test_an_export_never_overwrites_a_file_that_is_not_a_gguf(tmp_path):
    mine = tmp_path / "notes.gguf"
    mine.write_text("my notes")
    with pytest.raises(WorkbenchError, match="not a GGUF file"):
        check_out(mine)
    assert mine.read_text() == "my notes"
    with pytest.raises(WorkbenchError, match="is a folder"):
        check_out(tmp_path)


def test_llama_servers_counters_read_as_vllms():
    from engine.serve.metrics import parse_spec_metrics, spec_delta

    text = ("# HELP llamacpp:spec_decode_num_drafts_total Speculative\nllamacpp:spec_decode_num_drafts_total 10\n"
            "llamacpp:spec_decode_num_draft_tokens_total 30\nllamacpp:spec_decode_num_accepted_tokens_total 12\n"
            "llamacpp:tokens_predicted_total 99\nvllm:spec_decode_num_drafts_total 5\n")
    snap = parse_spec_metrics(text)
    assert (snap.num_drafts, snap.num_draft_tokens, snap.num_accepted_tokens) == (15, 30, 12)
    assert spec_delta(type(snap)(), parse_spec_metrics(text.replace("vllm:spec_decode_num_drafts_total 5\n", "")))[
        "mean_acceptance_length"] == pytest.approx(2.2)


def test_a_missing_compiler_or_cmake_is_named_before_building(monkeypatch):
    import engine.llamacpp.build as b

    monkeypatch.setattr(b.shutil, "which", lambda name: None)
    with pytest.raises(WorkbenchError, match=r"needs cmake and a C\+\+ compiler(.|\n)*apt-get install cmake g\+\+"):
        b.tools_missing()
    monkeypatch.setattr(b.shutil, "which", lambda name: "/usr/bin/" + name)
    b.tools_missing()  # both there: nothing to say


def test_the_gguf_cache_drops_the_least_recently_used_over_its_limit(tmp_path, monkeypatch):
    import json
    import os

    from engine.llamacpp.gguf import CACHE_GB_ENV, MADE_BY, prune_cache, used

    files = []
    for i in range(4):
        f = tmp_path / f"d{i}.gguf"
        f.write_bytes(b"GGUF" + b"\0" * 1020)  # 1 KiB each
        (tmp_path / f"d{i}.json").write_text(json.dumps({"made_by": MADE_BY}))
        os.utime(f, (1000 + i, 1000 + i))
        files.append(f)
    for name, note in (("mine.gguf", None), ("noted.gguf", {"source": "by hand"})):  # not written by the cache
        (tmp_path / name).write_bytes(b"GGUF" + b"\0" * 1020)
        os.utime(tmp_path / name, (1, 1))  # the least recently used of all
        if note:
            (tmp_path / name).with_suffix(".json").write_text(json.dumps(note))
    used(files[0])  # the oldest, used just now
    monkeypatch.setenv(CACHE_GB_ENV, str(2.5 * 1024 / 2**30))  # room for two and a half of the cache's own
    prune_cache(tmp_path, keep=files[3])
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["d0.gguf", "d3.gguf", "mine.gguf", "noted.gguf"]
    assert not (tmp_path / "d1.json").exists() and (tmp_path / "d0.json").exists()
    assert (tmp_path / "noted.json").exists()
