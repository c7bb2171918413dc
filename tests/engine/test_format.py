"""Speculators configs: fixtures round-trip, the builder reproduces them, vLLM rules and our rules."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from engine.format import vllm_rules as vr
from engine.format.checkpoint import load_state_dict, save_checkpoint, tensor_index
from engine.format.config import CONFIG_TYPES, build_draft_config, parse_draft_config
from engine.format.validate import validate_draft

ALGOS = ["eagle3_llama31_8b", "eagle3_qwen3_8b", "peagle_qwen3_8b", "dflash_qwen3_8b", "dflash2_qwen3_8b",
         "dspark_qwen3_8b"]


def load_fixture(fixtures_dir, name):
    return json.loads((fixtures_dir / name / "config.json").read_text())


def fixture_shapes(fixtures_dir, name):
    shapes = {}
    for line in (fixtures_dir / name / "state_dict.tsv").read_text().splitlines():
        tname, shape, _dtype, saved = line.split("\t")
        if saved == "saved":
            shapes[tname] = tuple(json.loads(shape))
    return shapes


@pytest.mark.parametrize("name", ALGOS)
def test_fixture_round_trips_unchanged(fixtures_dir, name):
    data = load_fixture(fixtures_dir, name)
    cfg = parse_draft_config(data)
    assert json.loads(cfg.to_json()) == data
    assert type(cfg) is CONFIG_TYPES.get(data["speculators_model_type"])


@pytest.mark.parametrize("name", ALGOS)
def test_fixture_with_its_tensor_listing_is_valid(fixtures_dir, name):
    report = validate_draft(fixtures_dir / name, tensor_shapes=fixture_shapes(fixtures_dir, name))
    assert report.ok, report.errors
    assert report.vllm_speculative_config["num_speculative_tokens"] >= 1


def _llama31():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072, rms_norm_eps=1e-5, vocab_size=128256, num_hidden_layers=32,
        rope_parameters={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"},
        architectures=["LlamaForCausalLM"])


def _qwen3_8b():
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rms_norm_eps=1e-6, vocab_size=151936, num_hidden_layers=36,
        rope_parameters={"rope_theta": 1000000, "rope_type": "default"}, architectures=["Qwen3ForCausalLM"])


BUILDS = {
    "eagle3_llama31_8b": ("eagle3", _llama31, "meta-llama/Llama-3.1-8B-Instruct",
                          dict(draft_vocab_size=32000, eagle_aux_hidden_state_layer_ids=[2, 16, 29],
                               norm_before_fc=True, norm_before_residual=True, norm_output=True)),
    "eagle3_qwen3_8b": ("eagle3", _qwen3_8b, "Qwen/Qwen3-8B",
                        dict(draft_vocab_size=32000, eagle_aux_hidden_state_layer_ids=[2, 18, 33],
                             norm_before_fc=True, norm_before_residual=True, norm_output=True)),
    "peagle_qwen3_8b": ("peagle", _qwen3_8b, "Qwen/Qwen3-8B",
                        dict(num_layers=4, draft_vocab_size=151936, eagle_aux_hidden_state_layer_ids=[2, 18, 33],
                             mask_token_id=151669, speculative_tokens=4)),
    "dflash_qwen3_8b": ("dflash", _qwen3_8b, "Qwen/Qwen3-8B",
                        dict(num_layers=5, block_size=16, draft_vocab_size=32000,
                             aux_hidden_state_layer_ids=[2, 18, 33], mask_token_id=151669)),
    "dspark_qwen3_8b": ("dspark", _qwen3_8b, "Qwen/Qwen3-8B",
                        dict(num_layers=5, draft_vocab_size=32000, aux_hidden_state_layer_ids=[2, 18, 33],
                             mask_token_id=151669)),
    "dflash2_qwen3_8b": ("dflash2", _qwen3_8b, "Qwen/Qwen3-8B",
                         dict(num_layers=5, draft_vocab_size=151936, aux_hidden_state_layer_ids=[2, 18, 33],
                              mask_token_id=151669)),
}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_builder_writes_the_structure_speculators_writes(fixtures_dir, name):
    algo, verifier, verifier_name, fields = BUILDS[name]
    fields = dict(fields)
    speculative_tokens = fields.pop("speculative_tokens", None)
    cfg = build_draft_config(algo, verifier_config=verifier(), verifier_name=verifier_name,
                             speculative_tokens=speculative_tokens, **fields)
    mine = json.loads(cfg.to_json())
    expected = load_fixture(fixtures_dir, name)
    mine["transformers_version"] = expected["transformers_version"]
    assert mine == expected


# -- vLLM rules: each with a good and a broken config ---------------------------------------------


@pytest.fixture
def good(fixtures_dir):
    return load_fixture(fixtures_dir, "eagle3_llama31_8b")


def broken(cfg, path, value=KeyError):
    cfg = copy.deepcopy(cfg)
    node = cfg
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return cfg


VLLM_CASES = [
    # (mutation path, value, expected vLLM message fragment, field)
    (("speculators_config",), KeyError, "ValueError: Invalid speculators config structure", "speculators_config"),
    (("speculators_config", "proposal_methods"), [], "ValueError: Invalid speculators config structure",
     "speculators_config.proposal_methods[0]"),
    (("speculators_config", "verifier"), KeyError, "ValueError: Invalid speculators config structure",
     "speculators_config.verifier.name_or_path"),
    (("speculators_model_type",), KeyError, "ValueError: Invalid speculators config structure",
     "speculators_model_type"),
    (("speculators_config", "proposal_methods", 0, "speculative_tokens"), KeyError,
     "ValueError: Invalid speculators config structure", "speculators_config.proposal_methods[0].speculative_tokens"),
    (("transformer_layer_config",), KeyError, "ValueError: Must provide transformer_layer_config",
     "transformer_layer_config"),
    (("transformer_layer_config",), [], "TypeError: 'transformer_layer_config' must be a dictionary if provided",
     "transformer_layer_config"),
    (("speculators_config", "proposal_methods", 0, "speculative_tokens"), None,
     "ValueError: Missing 'speculative_tokens' in proposal method. Got: {", None),
    (("speculators_config", "proposal_methods", 0, "speculative_tokens"), 0,
     "ValueError: Expected num_speculative_tokens to be greater than zero", None),
    (("speculators_model_type",), "medusa", "ValueError: Expected one of: {'eagle3'", "speculators_model_type"),
    (("transformer_layer_config", "model_type"), "mistral",
     "ValueError: Unsupported model_type mistral for Eagle3 speculator", "transformer_layer_config.model_type"),
    (("model_type",), "llama", "model type `llama`", "model_type"),
]


@pytest.mark.parametrize("path,value,fragment,field", VLLM_CASES)
def test_vllm_rule_broken_and_good(good, path, value, fragment, field):
    assert validate_draft(good, check_weights=False).ok
    report = validate_draft(broken(good, list(path), value), check_weights=False)
    assert not report.ok
    vllm_errors = [e for e in report.errors if e.layer == "vllm"]
    assert vllm_errors, report.errors
    assert any(fragment in e.vllm_message for e in vllm_errors), [e.vllm_message for e in vllm_errors]
    if field:
        assert any(e.field == field for e in vllm_errors), [e.field for e in vllm_errors]


def test_vllm_peagle_needs_mask_token_id_and_maps_to_parallel_eagle3(fixtures_dir):
    cfg = load_fixture(fixtures_dir, "peagle_qwen3_8b")
    report = validate_draft(cfg, check_weights=False)
    assert report.ok and report.vllm_speculative_config["method"] == "eagle3"
    assert report.vllm_speculative_config["parallel_drafting"] is True
    assert report.vllm_hf_config["pard_token"] == 151669
    bad = broken(cfg, ["mask_token_id"])
    report = validate_draft(bad, check_weights=False)
    assert any(e.vllm_message == "KeyError: 'mask_token_id'" for e in report.errors)


@pytest.mark.parametrize("key", ["aux_hidden_state_layer_ids", "mask_token_id"])
def test_vllm_dflash_required_keys(fixtures_dir, key):
    cfg = load_fixture(fixtures_dir, "dflash_qwen3_8b")
    hf = vr.extract_transformers_pre_trained_config(cfg)
    assert hf["dflash_config"]["target_layer_ids"] == [1, 17, 32]
    assert hf["dflash_config"]["causal"] is True  # sliding_window_non_causal: false
    report = validate_draft(broken(cfg, [key]), check_weights=False)
    assert any(e.vllm_message == f"KeyError: '{key}'" and e.field == key for e in report.errors)


def test_vllm_dflash2_maps_to_dflash_and_dspark_keeps_arch(fixtures_dir):
    assert vr.extract_vllm_speculative_config(load_fixture(fixtures_dir, "dflash2_qwen3_8b"))["method"] == "dflash"
    dspark = load_fixture(fixtures_dir, "dspark_qwen3_8b")
    hf = vr.extract_transformers_pre_trained_config(dspark)
    assert hf["architectures"] == ["Qwen3DSparkModel"] and hf["target_layer_ids"] == [1, 17, 32]
    assert hf["dspark_bonus_anchor"] is False


def test_eagle3_norm_before_residual_defaults_true_in_vllm(good):
    cfg = broken(good, ["norm_before_residual"])
    assert vr.extract_transformers_pre_trained_config(cfg)["norm_before_residual"] is True
    assert vr.extract_transformers_pre_trained_config(good)["architectures"] == ["Eagle3LlamaForCausalLM"]


def test_local_verifier_is_a_warning_and_only_explicit_command(good, tmp_path):
    cfg = broken(good, ["speculators_config", "verifier", "name_or_path"], str(tmp_path))
    report = validate_draft(cfg, check_weights=False)
    assert report.ok  # still servable with --model/--speculative-config
    w = [i for i in report.warnings if i.field == "speculators_config.verifier.name_or_path" and i.vllm_message]
    assert w and "must name a remote model repository" in w[0].vllm_message
    assert len(report.serve_commands) == 1 and "--speculative-config" in report.serve_commands[0]
    report = validate_draft(good, check_weights=False)
    assert report.serve_commands[0].startswith("vllm serve ") and len(report.serve_commands) == 2
    assert '"method": "eagle3"' in report.serve_commands[1]
    assert '"num_speculative_tokens": 3' in report.serve_commands[1]


# -- project rules --------------------------------------------------------------------------------

LLAMA_VERIFIER = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
                  "vocab_size": 128256}


@pytest.mark.parametrize("ids,fragment", [
    ([2, 16, 40], "outside the verifier's depth"),
    ([2, 16, 32], "last layer"),
    ([2, 16, 16], "duplicate"),
    ([16, 2, 29], "not ascending"),
])
def test_aux_layer_ids_checked_against_verifier(good, ids, fragment):
    assert validate_draft(good, check_weights=False, verifier_config=LLAMA_VERIFIER).ok
    report = validate_draft(broken(good, ["eagle_aux_hidden_state_layer_ids"], ids), check_weights=False,
                            verifier_config=LLAMA_VERIFIER)
    msgs = [e.message for e in report.errors if e.field == "eagle_aux_hidden_state_layer_ids"]
    assert any(fragment in m for m in msgs), report.errors


def test_verifier_hidden_and_vocab_mismatch(good):
    report = validate_draft(good, check_weights=False, verifier_config={**LLAMA_VERIFIER, "hidden_size": 2048,
                                                                          "vocab_size": 32000})
    fields = {e.field for e in report.errors}
    # no target_hidden_size in the config: its own hidden size is the one that disagrees (and is named)
    assert {"transformer_layer_config.hidden_size", "transformer_layer_config.vocab_size"} <= fields
    with_ht = validate_draft(broken(good, ["target_hidden_size"], 1024), check_weights=False,
                             verifier_config={**LLAMA_VERIFIER, "hidden_size": 2048})
    assert "target_hidden_size" in {e.field for e in with_ht.errors}


def test_llama_eagle3_with_four_aux_layers_needs_num_aux_hidden_states(good):
    cfg = broken(good, ["eagle_aux_hidden_state_layer_ids"], [2, 10, 16, 29])
    report = validate_draft(cfg, check_weights=False)
    assert any(e.field == "transformer_layer_config.num_aux_hidden_states" for e in report.errors)
    cfg["transformer_layer_config"]["num_aux_hidden_states"] = 4
    assert validate_draft(cfg, check_weights=False).ok


def test_required_algorithm_fields_and_unsupported_algorithm(fixtures_dir):
    dflash = load_fixture(fixtures_dir, "dflash_qwen3_8b")
    report = validate_draft(broken(dflash, ["mask_token_id"], None), check_weights=False)
    assert any(e.field == "mask_token_id" and e.layer == "project" for e in report.errors)
    report = validate_draft(broken(dflash, ["speculators_config", "proposal_methods", 0, "speculative_tokens"], 16),
                            check_weights=False)
    assert any("drafts at most 15" in e.message for e in report.errors)
    mixed = copy.deepcopy(dflash)
    mixed["transformer_layer_config"]["layer_types"][0] = "full_attention"
    report = validate_draft(mixed, check_weights=False)
    assert report.ok and any("mixed sliding/full" in w.message for w in report.warnings)
    xpress = validate_draft(fixtures_dir / "xpress_qwen3_8b", check_weights=False)
    assert not xpress.ok and xpress.errors[0].field == "speculators_model_type"
    dflash2 = load_fixture(fixtures_dir, "dflash2_qwen3_8b")
    report = validate_draft(broken(dflash2, ["conv_group_size"], 5), check_weights=False)
    assert any(e.field == "conv_group_size" for e in report.errors)


def test_layer_config_types_are_checked(good):
    report = validate_draft(broken(good, ["transformer_layer_config", "hidden_size"], "abc"), check_weights=False)
    assert any(e.field == "transformer_layer_config.hidden_size" for e in report.errors)
    report = validate_draft(broken(good, ["transformer_layer_config", "rms_norm_eps"], -1), check_weights=False)
    assert any(e.field == "transformer_layer_config.rms_norm_eps" for e in report.errors)


def test_typed_field_errors_name_the_field(good):
    report = validate_draft(broken(good, ["draft_vocab_size"], "many"), check_weights=False)
    assert any(e.field == "draft_vocab_size" for e in report.errors)
    report = validate_draft(broken(good, ["fc_norm"], True), check_weights=False)
    assert any("mutually exclusive" in e.message for e in report.errors)


# -- tensors --------------------------------------------------------------------------------------


def tiny_eagle3_checkpoint(tmp_path, *, vocab=96, dvocab=32, hidden=32, mutate=None, verifier_name="org/tiny"):
    """A small random EAGLE-3 checkpoint with exactly the tensors vLLM expects."""
    from transformers import LlamaConfig

    verifier = LlamaConfig(hidden_size=hidden, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, vocab_size=vocab, num_hidden_layers=8, architectures=["LlamaForCausalLM"])
    cfg = build_draft_config("eagle3", verifier_config=verifier, verifier_name=verifier_name,
                             draft_vocab_size=dvocab, eagle_aux_hidden_state_layer_ids=[2, 4, 5],
                             norm_before_fc=True, norm_before_residual=True)
    hf = vr.extract_transformers_pre_trained_config(cfg.to_dict())
    expected, optional = vr.expected_parameters(cfg.to_dict(), hf)
    state = {k: torch.randn(s) for k, s in expected.items() if k not in optional or k == "lm_head.weight"}
    selected = torch.sort(torch.randperm(vocab)[:dvocab]).values
    state["d2t"] = selected - torch.arange(dvocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[selected] = True
    state["t2d"] = t2d
    if mutate:
        mutate(state)
    return save_checkpoint(tmp_path / "draft", cfg, state, dtype=torch.bfloat16)


def test_valid_checkpoint_and_cli_json(tmp_path):
    folder = tiny_eagle3_checkpoint(tmp_path)
    report = validate_draft(folder)
    assert report.ok, report.errors
    out = subprocess.run([sys.executable, "-m", "engine", "validate", str(folder), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["ok"] is True and data["errors"] == []
    assert data["vllm_speculative_config"] == {"method": "eagle3", "num_speculative_tokens": 3,
                                               "model": str(folder.resolve())}
    assert data["serve_commands"][0] == f"vllm serve {folder.resolve()}"
    assert set(data) >= {"ok", "errors", "vllm_speculative_config", "serve_commands"}
    # a lone config.json checks only the config
    out = subprocess.run([sys.executable, "-m", "engine", "validate", str(folder / "config.json"), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and json.loads(out.stdout)["ok"]


@pytest.mark.parametrize("mutate,field,fragment,layer", [
    (lambda s: s.__setitem__("fc.weight", torch.randn(32, 64)), "tensor:fc.weight", "Attempted to load weight", "vllm"),
    (lambda s: s.__setitem__("verifier_norm.weight", torch.randn(32)), "tensor:verifier_norm.weight",
     "There is no module or parameter named", "vllm"),
    (lambda s: s.pop("norm.weight"), "tensor:norm.weight", "missing tensor", "project"),
    (lambda s: s.pop("lm_head.weight"), "tensor:lm_head.weight", "no lm_head", "project"),
    (lambda s: s.__setitem__("d2t", s["d2t"].flip(0)), "tensor:d2t", "strictly increasing", "project"),
    (lambda s: s.__setitem__("d2t", s["d2t"][:-1]), "tensor:d2t", "Attempted to load weight", "vllm"),
    (lambda s: s.__setitem__("d2t", s["d2t"] + 1000), "tensor:d2t", "outside", "project"),
    (lambda s: s["t2d"].__setitem__(slice(None), True), "tensor:t2d", "marks 96 tokens", "project"),
])
def test_broken_tensors(tmp_path, mutate, field, fragment, layer):
    report = validate_draft(tiny_eagle3_checkpoint(tmp_path, mutate=mutate))
    assert not report.ok
    hits = [e for e in report.errors if e.field == field and e.layer == layer]
    assert hits, [(e.field, e.layer, e.message) for e in report.errors]
    assert any(fragment in (e.vllm_message or e.message) for e in hits)


def test_nan_weights_found_always_in_small_drafts_and_with_deep_in_large_ones(tmp_path, monkeypatch):
    from engine.format import validate

    folder = tiny_eagle3_checkpoint(tmp_path, mutate=lambda s: s["fc.weight"].__setitem__((0, 0), float("nan")))
    assert [e.field for e in validate_draft(folder).errors if "NaN" in e.message] == ["tensor:fc.weight"]
    monkeypatch.setattr(validate, "ALWAYS_CHECK_VALUES_BYTES", 10)  # "a large draft": values only with --deep
    report = validate_draft(folder)
    assert report.ok and any("validate --deep" in w.message for w in report.warnings)
    assert any("NaN" in e.message for e in validate_draft(folder, deep=True).errors)


def test_pickled_weights_refused_unless_allowed(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    torch.save({"fc.weight": torch.ones(2, 2)}, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="unpickling can run arbitrary code"):
        load_state_dict(folder)
    assert torch.equal(load_state_dict(folder, allow_pickle=True)["fc.weight"], torch.ones(2, 2))


def test_sharded_checkpoint_reads_back(tmp_path):
    state = {f"w{i}": torch.randn(64, 64) for i in range(4)}
    folder = save_checkpoint(tmp_path / "sharded", {"a": 1}, state, max_shard_bytes=40_000)
    assert (folder / "model.safetensors.index.json").is_file()
    assert set(tensor_index(folder)) == set(state)
    back = load_state_dict(folder)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_a_tensor_in_its_own_shard_is_the_same_file_in_every_draft_that_stores_it(tmp_path):
    """The verifier's embedding gets a shard of its own: two drafts with different weights share that file byte for
    byte (git keeps one copy), and both read back whole."""
    embed = torch.randn(32, 8).to(torch.bfloat16)
    folders = [save_checkpoint(tmp_path / f"d{i}", {"v": i}, {"fc.weight": torch.randn(8, 16),
                                                             "embed_tokens.weight": embed},
                               dtype=torch.bfloat16, own_shards=["embed_tokens.weight"]) for i in range(2)]
    index = json.loads((folders[0] / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["embed_tokens.weight"] != index["fc.weight"] and not (folders[0] / "model.safetensors").exists()
    shard = index["embed_tokens.weight"]
    assert (folders[0] / shard).read_bytes() == (folders[1] / shard).read_bytes()
    assert (folders[0] / index["fc.weight"]).read_bytes() != (folders[1] / index["fc.weight"]).read_bytes()
    assert all(torch.equal(load_state_dict(f)["embed_tokens.weight"], embed) for f in folders)
    alone = save_checkpoint(tmp_path / "slim", {}, {"fc.weight": torch.ones(2)}, own_shards=["embed_tokens.weight"])
    assert [p.name for p in alone.glob("*.safetensors")] == ["model.safetensors"]  # nothing to set apart


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path):
    folder = save_checkpoint(tmp_path / "ckpt", {"v": 1}, {"w": torch.ones(3)})

    class Boom(dict):
        def items(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_checkpoint(folder, {"v": 2}, Boom())
    assert json.loads((folder / "config.json").read_text()) == {"v": 1}
    assert torch.equal(load_state_dict(folder)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp folders left behind


# -- token ids and layer ids against the verifier (every type declares its own id fields) --------------------


SMOL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36, "vocab_size": 49152}


def test_validate_refuses_a_mask_token_outside_the_verifiers_vocabulary(fixtures_dir):
    """A DFlash draft whose mask token is 10,000,000 with a 49,152-token verifier: vLLM indexes out of its embedding
    at the first step. The finding names the field, the value, the allowed range and the fix."""
    cfg = load_fixture(fixtures_dir, "dflash_qwen3_8b")
    verifier = {**SMOL, "hidden_size": cfg["transformer_layer_config"]["hidden_size"]}
    cfg["transformer_layer_config"]["vocab_size"] = 49152
    cfg["mask_token_id"] = 10_000_000
    report = validate_draft(cfg, verifier_config=verifier, check_weights=False)
    found = [e for e in report.errors if e.field == "mask_token_id"]
    assert found, report.errors
    assert "10000000" in found[0].message and "0..49151" in found[0].message and "set it to" in found[0].message
    cfg["mask_token_id"] = 49151
    assert not [e for e in validate_draft(cfg, verifier_config=verifier, check_weights=False).errors
                if e.field == "mask_token_id"]


@pytest.mark.parametrize("name", ["peagle_qwen3_8b", "dflash_qwen3_8b", "dspark_qwen3_8b", "dflash2_qwen3_8b"])
def test_every_token_id_a_type_declares_is_checked_without_a_verifier_too(fixtures_dir, name):
    from engine.format.config import CONFIG_TYPES

    cfg = load_fixture(fixtures_dir, name)
    fields = CONFIG_TYPES.get(cfg["speculators_model_type"]).token_id_fields
    assert "mask_token_id" in fields
    for field in fields:
        bad = {**cfg, field: cfg["transformer_layer_config"]["vocab_size"]}  # one past the last id
        report = validate_draft(bad, verifier_config={}, check_weights=False)
        assert any(e.field == field and "is outside" in e.message for e in report.errors), (field, report.errors)


def test_layer_config_token_ids_out_of_range_are_a_warning(fixtures_dir):
    cfg = load_fixture(fixtures_dir, "eagle3_llama31_8b")
    cfg["transformer_layer_config"]["eos_token_id"] = [128001, 999_999]
    report = validate_draft(cfg, check_weights=False, verifier_config={})
    assert report.ok
    assert any(w.field == "transformer_layer_config.eos_token_id" and "[999999]" in w.message for w in report.warnings)


def test_aux_layer_ids_are_checked_against_the_verifiers_depth(fixtures_dir):
    for name in ("eagle3_llama31_8b", "peagle_qwen3_8b", "dflash_qwen3_8b", "dspark_qwen3_8b"):
        cfg = load_fixture(fixtures_dir, name)
        from engine.format.config import CONFIG_TYPES

        field = CONFIG_TYPES.get(cfg["speculators_model_type"]).aux_field
        cfg[field] = [2, 18, 40]
        verifier = {"hidden_size": cfg["transformer_layer_config"]["hidden_size"], "num_hidden_layers": 36,
                    "vocab_size": cfg["transformer_layer_config"]["vocab_size"]}
        report = validate_draft(cfg, verifier_config=verifier, check_weights=False)
        assert any(e.field == field and "outside the verifier's depth 0..36" in e.message for e in report.errors), name


def test_an_unknown_type_is_refused_naming_the_known_ones():
    from engine.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match=r"(?s)unknown speculators_model_type \"medusa\".*eagle3"):
        parse_draft_config({"speculators_model_type": "medusa"})
    with pytest.raises(KeyError):  # older callers catch a KeyError
        parse_draft_config({"speculators_model_type": "medusa"})
    with pytest.raises(WorkbenchError, match="unknown speculators_model_type"):
        vr.expected_parameters({"speculators_model_type": "medusa"}, {"hidden_size": 8, "num_attention_heads": 1,
                                                                     "intermediate_size": 8, "vocab_size": 8})


def test_validate_says_what_vllms_cpu_build_does_with_a_head_size_it_has_no_kernel_for(fixtures_dir):
    """vLLM's CPU build runs attention only for some head sizes: a draft or verifier with another one gets a warning
    that names the sizes (a GPU runs it, so it is not an error)."""
    from engine.format.validate import VLLM_CPU_HEAD_SIZES, validate_draft

    cfg = json.loads((fixtures_dir / "eagle3_llama31_8b" / "config.json").read_text())
    assert 128 in VLLM_CPU_HEAD_SIZES and 16 not in VLLM_CPU_HEAD_SIZES
    fine = validate_draft(cfg, check_weights=False)
    assert not [w for w in fine.warnings if "CPU build" in w.message]
    small = json.loads(json.dumps(cfg))
    small["transformer_layer_config"]["head_dim"] = 16
    [warning] = [w for w in validate_draft(small, check_weights=False).warnings if "CPU build" in w.message]
    assert warning.field == "transformer_layer_config.head_dim" and "head size is 16" in warning.message
    verifier = json.loads(json.dumps(cfg["transformer_layer_config"]))
    verifier.update(num_hidden_layers=32, head_dim=None, num_attention_heads=32)  # 4096 / 32 = 128: fine
    assert not [w for w in validate_draft(cfg, verifier_config=verifier, check_weights=False).warnings
                if "CPU build" in w.message]
    verifier["head_dim"] = 48
    flagged = [w for w in validate_draft(cfg, verifier_config=verifier, check_weights=False).warnings
               if "CPU build" in w.message]
    assert [w.field for w in flagged] == ["speculators_config.verifier"] and "head size is 48" in flagged[0].message


def test_a_draft_beside_a_linear_attention_verifier_is_refused_by_the_cpu_build(fixtures_dir, tmp_path):
    """The CPU build decodes beside Gated DeltaNet layers unlike its baseline (measured by
    benchmarks/bench_vllm_linear_attention.py): validate warns, and no server is started for a draft or n-gram beside
    such a target; the target alone, and a plain target with a draft, start as before."""
    from engine.errors import WorkbenchError
    from engine.format.validate import validate_draft
    from engine.serve.server import ServePlan, VllmServer
    from engine.serve.venv import VllmEnv

    cfg = json.loads((fixtures_dir / "eagle3_llama31_8b" / "config.json").read_text())
    verifier = json.loads(json.dumps(cfg["transformer_layer_config"])) | {"num_hidden_layers": 4}
    plain = [w for w in validate_draft(cfg, verifier_config=verifier, check_weights=False).warnings
             if "linear-attention" in w.message]
    hybrid = verifier | {"layer_types": ["linear_attention", "full_attention"] * 2}
    flagged = [w for w in validate_draft(cfg, verifier_config={"text_config": hybrid}, check_weights=False).warnings
               if "linear-attention" in w.message]
    assert not plain and len(flagged) == 1 and "refuses this pair" in flagged[0].message
    mla = verifier | {"kv_lora_rank": 512}
    [warned] = [w for w in validate_draft(cfg, verifier_config=mla, check_weights=False).warnings
                if "MLA target" in w.message]
    assert "refuses this pair" in warned.message

    def argv(config: dict, spec: dict | None, **kw) -> list[str]:
        target = tmp_path / str(len(list(tmp_path.iterdir())))
        target.mkdir()
        (target / "config.json").write_text(json.dumps(config))
        plan = ServePlan(model=str(target), target=str(target), form="explicit" if spec else "none",
                         speculative_config=spec)
        return VllmServer(plan, venv=VllmEnv(tmp_path, "cpu", "0", "0"), **kw).argv()

    spec = {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(WorkbenchError, match="does not decode speculatively beside linear-attention"):
        argv(hybrid, spec)
    assert "--no-enable-prefix-caching" in argv(hybrid, spec, lossless_only=False)  # the benchmark's way
    assert "--no-enable-prefix-caching" not in argv(hybrid, None)  # the target alone: vLLM's own defaults
    assert "--no-enable-prefix-caching" not in argv(verifier, spec)
    mla = verifier | {"kv_lora_rank": 512, "qk_rope_head_dim": 64}  # DeepSeek's latent attention
    with pytest.raises(WorkbenchError, match="cannot pair an MLA target"):
        argv(mla, spec)
    assert "--dtype" in argv(mla, None)  # the target alone starts


def test_validate_warns_where_vllms_cpu_build_refuses_the_type_and_only_there():
    """The warning comes from the type's `vllm_cpu_refusal` (vLLM's words): the shipped DFlash2 draft gets it, the
    shipped DFlash draft does not."""
    from pathlib import Path

    from engine.algos.dflash2.config import DFlash2Config
    from engine.format.validate import validate_draft

    drafts = Path(__file__).resolve().parents[2] / "assets" / "drafts"
    gpu_only = validate_draft(drafts / "smollm2-135m-instruct-dflash2")
    fields = [w.field for w in gpu_only.warnings if "GPUs only" in w.message]
    assert gpu_only.ok and fields == ["speculators_model_type"]
    assert any(DFlash2Config.vllm_cpu_refusal in w.message for w in gpu_only.warnings)
    assert not any("GPUs only" in w.message for w in validate_draft(drafts / "smollm2-135m-instruct-dflash").warnings)
