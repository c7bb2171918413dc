"""vLLM backend: config and request building, connector file reading, and the whole flow against a fake vLLM."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.data.extract import vllm as vb
from engine.data.extract.dataset import TargetInfo, extract_hidden_states, load_sample
from engine.data.options import ExtractOptions
from engine.data.render.chat import render_rows
from engine.errors import WorkbenchError
from engine.targets.capture import capture_hidden_states

CHATS = [{"id": f"c{i}", "messages": [{"role": "user", "content": "hello " * (i + 1)},
                                      {"role": "assistant", "content": "the quick brown fox " * (i + 1)}]}
         for i in range(5)]


def test_llm_kwargs_follow_the_extract_hidden_states_recipe(tmp_path):
    kw = vb.llm_kwargs("/models/t", [27, 2, 15, 30], tmp_path, tensor_parallel_size=4, max_model_len=2049)
    assert kw["speculative_config"] == {
        "method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27, 30]}}}
    assert kw["kv_transfer_config"] == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                                        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
    assert kw["enable_chunked_prefill"] is False and kw["enable_prefix_caching"] is False
    assert kw["tensor_parallel_size"] == 4 and kw["max_model_len"] == 2049 and kw["model"] == "/models/t"
    assert vb.sampling_kwargs() == {"max_tokens": 1, "temperature": 0.0}
    with pytest.raises(WorkbenchError, match="no layer ids"):
        vb.speculative_config([])


def test_prompts_and_output_paths():
    from engine.data.render.chat import RenderedRow

    rows = [RenderedRow("a", [1, 2, 3], [0, 1, 1])]
    assert vb.prompts_for(rows) == [{"prompt_token_ids": [1, 2, 3]}]
    out = types.SimpleNamespace(kv_transfer_params={"hidden_states_path": "/shm/req-1.safetensors"})
    assert vb.output_path(out) == Path("/shm/req-1.safetensors")
    with pytest.raises(WorkbenchError, match="no hidden_states_path"):
        vb.output_path(types.SimpleNamespace(kv_transfer_params=None))


def test_read_connector_file_takes_the_lock_and_checks_keys(tmp_path):
    path = tmp_path / "req.safetensors"
    save_file({"hidden_states": torch.zeros(3, 2, 4, dtype=torch.bfloat16), "token_ids": torch.arange(3)}, str(path))
    Path(f"{path}.lock").touch()
    data = vb.read_connector_file(path)
    assert data["hidden_states"].shape == (3, 2, 4) and data["token_ids"].tolist() == [0, 1, 2]
    save_file({"x": torch.zeros(1)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(WorkbenchError, match="not a hidden-states file"):
        vb.read_connector_file(tmp_path / "bad.safetensors")


def test_unavailable_vllm_is_a_clear_error(monkeypatch, tmp_path):
    """Neither vLLM here with a GPU nor vLLM's own environment: refused up front, saying how to get one."""
    monkeypatch.setattr(vb, "_in_process_reason", lambda: "vLLM is not installed in this environment")
    monkeypatch.setenv("WORKBENCH_VLLM_VENV", str(tmp_path / "no-venv"))
    assert "not installed at" in vb.vllm_unavailable_reason()
    with pytest.raises(WorkbenchError, match="vllm extraction backend cannot run") as err:
        vb.require_vllm()
    assert "make vllm-env" in err.value.hint
    from engine.data.extract.dataset import extract_dataset

    with pytest.raises(WorkbenchError, match="cannot run"):
        extract_dataset(ExtractOptions(target="anything", dataset="sharegpt", out=tmp_path / "unused", backend="vllm"))
    assert not (tmp_path / "unused").exists()


class FakeLLM:
    """Behaves like vLLM with the ExampleHiddenStatesConnector: one file per request, token_ids = the prompt."""

    def __init__(self, model, kwargs):
        self.model = model
        self.layer_ids = kwargs["speculative_config"]["draft_model_config"]["hf_config"][
            "eagle_aux_hidden_state_layer_ids"]
        self.storage = Path(kwargs["kv_transfer_config"]["kv_connector_extra_config"]["shared_storage_path"])
        self.calls = 0

    def generate(self, prompts, params, use_tqdm=True):
        assert params.kwargs == {"max_tokens": 1, "temperature": 0.0}
        outputs = []
        for p in prompts:
            self.calls += 1
            ids = torch.tensor([p["prompt_token_ids"]])
            hs = capture_hidden_states(self.model, ids, self.layer_ids)[0].to(torch.bfloat16)  # [T, L, H]
            path = self.storage / f"req-{self.calls}.safetensors"
            Path(f"{path}.lock").touch()
            save_file({"hidden_states": hs, "token_ids": ids[0]}, str(path))
            outputs.append(types.SimpleNamespace(kv_transfer_params={"hidden_states_path": str(path)}))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: types.SimpleNamespace(kwargs=kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_flow_writes_the_same_files_as_transformers(tiny_llama, tmp_path, fake_vllm, monkeypatch):
    rows = render_rows(tiny_llama.tokenizer, CHATS)
    ids = [1, 2, 4]
    info = TargetInfo.from_target(tiny_llama)
    created = {}

    def make(storage):
        created["llm"] = FakeLLM(tiny_llama.model, vb.llm_kwargs(info.path, ids, storage))
        return created["llm"]

    monkeypatch.setattr(vb, "staging_dir", lambda out: Path(out) / ".staging")
    (tmp_path / "v" / ".staging").mkdir(parents=True)
    llm = make(tmp_path / "v" / ".staging")
    manifest = vb.extract_rows_vllm(info, rows, ExtractOptions(out=tmp_path / "v"), ids, llm=llm, chunk=2,
                                    progress=False)
    assert manifest["backend"] == "vllm" and manifest["samples"] == len(rows) and manifest["complete"]
    assert not (tmp_path / "v" / ".staging").exists()  # staging files collected and removed
    extract_hidden_states(tiny_llama, rows, ExtractOptions(out=tmp_path / "t"), ids, progress=False)
    for i in range(len(rows)):
        a, b = load_sample(tmp_path / "v" / f"hs_{i}.safetensors"), load_sample(tmp_path / "t" / f"hs_{i}.safetensors")
        assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        torch.testing.assert_close(a["hidden_states"].float(), b["hidden_states"].float(), rtol=2e-2, atol=2e-2)
    # resume: nothing left to do, no request sent
    (tmp_path / "v" / ".staging").mkdir()
    again = make(tmp_path / "v" / ".staging")
    vb.extract_rows_vllm(info, rows, ExtractOptions(out=tmp_path / "v"), ids, llm=again, progress=False)
    assert again.calls == 0


def test_vllm_token_mismatch_is_refused(tiny_llama, tmp_path, fake_vllm, monkeypatch):
    rows = render_rows(tiny_llama.tokenizer, CHATS[:2])
    info = TargetInfo.from_target(tiny_llama)
    monkeypatch.setattr(vb, "staging_dir", lambda out: Path(out) / ".staging")
    (tmp_path / ".staging").mkdir(parents=True)
    llm = FakeLLM(tiny_llama.model, vb.llm_kwargs(info.path, [1, 4], tmp_path / ".staging"))
    real = llm.generate
    llm.generate = lambda prompts, params, use_tqdm=True: real(
        [{"prompt_token_ids": p["prompt_token_ids"][:-1]} for p in prompts], params)
    with pytest.raises(WorkbenchError, match="other token ids"):
        vb.extract_rows_vllm(info, rows, ExtractOptions(out=tmp_path), [1, 4], llm=llm, progress=False)
    assert not list(tmp_path.glob("hs_*"))


def test_make_llm_wraps_the_connector_config(fake_vllm, monkeypatch, tmp_path):
    seen = {}
    fake_vllm.LLM = lambda **kw: seen.update(kw) or "llm"
    config = types.ModuleType("vllm.config")
    config.KVTransferConfig = lambda **kw: ("KVTransferConfig", kw)
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    assert vb.make_llm(vb.llm_kwargs("m", [2, 4], tmp_path)) == "llm"
    assert seen["kv_transfer_config"][0] == "KVTransferConfig"
    assert seen["kv_transfer_config"][1]["kv_connector"] == "ExampleHiddenStatesConnector"


# -- real vLLM (the CPU build in its own environment) -------------------------------------------------------


@pytest.mark.vllm
def test_vllms_cpu_build_extracts_what_transformers_extracts(tmp_path):
    """`extract --backend vllm` on this CPU: vLLM's extract_hidden_states method in its own environment, written
    through the worker's CPU connector. Same files, token ids and loss masks as the transformers backend, and the
    same hidden states up to float32 kernel rounding (head size 32: the CPU build's attention has no kernel for 16)."""
    from engine.serve.venv import ensure_vllm_env
    from tiny import save_tiny_target

    env = ensure_vllm_env()
    assert env.flavor == "cpu" or torch.cuda.is_available()
    target = save_tiny_target(tmp_path / "target", "qwen3", hidden_size=128)
    common = dict(max_samples=6, max_length=96, dtype="fp32", algo="eagle3")
    from engine.data.extract.dataset import extract_dataset

    theirs = extract_dataset(ExtractOptions(target=str(target), dataset="sharegpt", out=tmp_path / "vllm",
                                            backend="vllm", **common), progress=False)
    ours = extract_dataset(ExtractOptions(target=str(target), dataset="sharegpt", out=tmp_path / "hf",
                                          backend="transformers", **common), progress=False)
    assert theirs["backend"] == "vllm" and theirs["complete"] and theirs["samples"] == ours["samples"] == 6
    assert theirs["layer_ids"] == ours["layer_ids"] and theirs["dtype"] == "fp32"
    for i in range(ours["samples"]):
        a, b = (load_sample(tmp_path / d / f"hs_{i}.safetensors") for d in ("vllm", "hf"))
        assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        assert a["hidden_states"].dtype == torch.float32
        torch.testing.assert_close(a["hidden_states"], b["hidden_states"], rtol=1e-4, atol=1e-4)
    assert not list((tmp_path / "vllm").glob(".workbench-hs-*"))  # staging removed
