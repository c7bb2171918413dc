"""Extraction: values equal the target's, vLLM-readable files, resume, safety checks, online mode, layer ids."""

from __future__ import annotations

import argparse
import json
from collections import namedtuple

import pytest
import torch
from safetensors.torch import load_file

from engine.algos.dflash.config import evenly_spaced_layer_ids
from engine.data.extract.dataset import HiddenStatesDataset, extract_hidden_states, load_sample, plan_padded_batches
from engine.data.extract.layer_ids import resolve_layer_ids
from engine.data.extract.online import OnlineHiddenStates
from engine.data.options import ExtractOptions
from engine.data.render.chat import render_rows
from engine.errors import WorkbenchError
from engine.jobs import DirLock

WORDS = "the quick brown fox jumps over the lazy dog and then some more words follow here".split()


def _rows(n: int = 9) -> list[dict]:
    """Chats of varied length, some multi-turn (so batches mix lengths and padding)."""
    rows = []
    for i in range(n):
        q = " ".join(WORDS[: 2 + (i * 3) % 12])
        messages = [{"role": "user", "content": f"{q}?"}, {"role": "assistant", "content": " ".join(WORDS[i % 5:])}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": "more"}, {"role": "assistant", "content": q}]
        rows.append({"id": f"r{i}", "messages": messages})
    return rows


@pytest.fixture(scope="module")
def rendered(tiny_llama):
    return render_rows(tiny_llama.tokenizer, _rows(), max_length=200)


def _reference(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), output_hidden_states=True).hidden_states  # N+1 x [1, T, H]


def test_extracted_values_equal_the_targets(tiny_llama, rendered, tmp_path):
    n = tiny_llama.num_layers
    layer_ids = [0, 1, 3, n]
    manifest = extract_hidden_states(tiny_llama, rendered,
                                     ExtractOptions(out=tmp_path, dtype="fp32", batch_size=4, batch_tokens=400),
                                     layer_ids, progress=False)
    assert manifest["samples"] == len(rendered) and manifest["complete"]
    for i, row in enumerate(rendered):
        sample = load_sample(tmp_path / f"hs_{i}.safetensors")
        ref = _reference(tiny_llama.model, row.input_ids)
        assert sample["hidden_states"].shape == (row.num_tokens, 4, tiny_llama.hidden_size)
        for j, k in enumerate(layer_ids[:-1]):
            torch.testing.assert_close(sample["hidden_states"][:, j], ref[k][0], rtol=1e-4, atol=1e-5)
        # id N is the last layer before the final norm
        torch.testing.assert_close(tiny_llama.final_norm()(sample["hidden_states"][:, -1]), ref[-1][0],
                                   rtol=1e-4, atol=1e-5)
        assert sample["token_ids"].tolist() == row.input_ids and sample["loss_mask"].tolist() == row.loss_mask


def test_builtin_target_values_and_vllm_only_reader(builtin_target, tmp_path):
    chats = [{"id": "a", "messages": [{"role": "user", "content": "What is 2+2?"},
                                      {"role": "assistant", "content": "2+2 is 4."}]},
             {"id": "b", "messages": [{"role": "user", "content": "Name a colour."},
                                      {"role": "assistant", "content": "Blue, like the sky on a clear day."}]}]
    rows = render_rows(builtin_target.tokenizer, chats)
    ids = resolve_layer_ids(builtin_target.num_layers, algo="eagle3")
    assert ids == [2, 15, 27, 30]
    manifest = extract_hidden_states(builtin_target, rows, ExtractOptions(out=tmp_path, dtype="fp32"), ids,
                                     progress=False)
    assert manifest["target"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and manifest["vocab_size"] == 49152
    for i, row in enumerate(rows):
        data = load_file(str(tmp_path / f"hs_{i}.safetensors"))  # what a vLLM-format reader does
        hs, tok = data["hidden_states"], data["token_ids"]
        assert hs.shape == (row.num_tokens, 4, 576) and tok.shape == (row.num_tokens,) and tok.dtype == torch.int64
        ref = _reference(builtin_target.model, row.input_ids)
        for j, k in enumerate([2, 15, 27]):
            torch.testing.assert_close(hs[:, j], ref[k][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(builtin_target.final_norm()(hs[:, 3]), ref[30][0], rtol=1e-4, atol=1e-4)


def test_manifest_token_freq_and_dataset_reader(tiny_llama, rendered, tmp_path):
    extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path), [2, 4], progress=False,
                          header_extra={"dataset": "d.jsonl", "split": "train", "max_length": 200})
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["format"] == "vllm-hidden-states" and m["layer_ids"] == [2, 4] and m["num_layers"] == 4
    assert m["dtype"] == "bf16" and m["hidden_size"] == 64 and m["vocab_size"] == tiny_llama.vocab_size
    assert m["samples"] == len(rendered) and m["tokens"] == sum(r.num_tokens for r in rendered)
    assert m["loss_tokens"] == sum(r.num_loss_tokens for r in rendered) and m["dataset"] == "d.jsonl"
    freq = load_file(str(tmp_path / "token_freq.safetensors"))
    assert set(freq) == {"counts"} and freq["counts"].dtype == torch.int64
    assert freq["counts"].shape == (tiny_llama.vocab_size,) and int(freq["counts"].sum()) == m["loss_tokens"]
    ds = HiddenStatesDataset(tmp_path)
    assert len(ds) == len(rendered) and ds.manifest["samples"] == len(rendered)
    item = ds[3]
    assert set(item) == {"hidden_states", "token_ids", "loss_mask"} and item["hidden_states"].dtype == torch.bfloat16
    assert ds.lengths() == [r.num_tokens for r in rendered]
    torch.testing.assert_close(ds.token_freq(), freq["counts"])
    (tmp_path / "token_freq.safetensors").unlink()
    torch.testing.assert_close(ds.token_freq(), freq["counts"])  # recomputed from the samples


class _Stop(Exception):
    pass


@pytest.mark.parametrize("error", [_Stop, KeyboardInterrupt])
def test_resume_after_interruption_gives_the_uninterrupted_result(tiny_llama, rendered, tmp_path, error):
    full = tmp_path / "full"
    extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=full, batch_size=2), [1, 4], progress=False)
    part = tmp_path / "part"
    written = []

    def boom(i):
        written.append(i)
        if len(written) == 4:
            raise error

    with pytest.raises(error):
        extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=part, batch_size=2), [1, 4], progress=False,
                              on_sample=boom)
    files = sorted(p.name for p in part.iterdir())
    assert not [f for f in files if f.endswith(".tmp")]
    m = json.loads((part / "manifest.json").read_text())
    assert m["samples"] == 4 and not m["complete"] and len([f for f in files if f.startswith("hs_")]) == 4
    again = []
    extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=part, batch_size=2), [1, 4], progress=False,
                          on_sample=again.append)
    assert sorted(again + written) == list(range(len(rendered)))  # nothing twice, nothing missing
    m = json.loads((part / "manifest.json").read_text())
    assert m["complete"] and m["samples"] == len(rendered)
    for i in range(len(rendered)):
        a, b = load_sample(full / f"hs_{i}.safetensors"), load_sample(part / f"hs_{i}.safetensors")
        for k in a:
            assert torch.equal(a[k], b[k]), (i, k)
    assert torch.equal(load_file(str(full / "token_freq.safetensors"))["counts"],
                       load_file(str(part / "token_freq.safetensors"))["counts"])


def test_stale_temp_files_and_unreadable_samples_are_redone(tiny_llama, rendered, tmp_path):
    extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path), [1, 4], progress=False)
    (tmp_path / ".hs_3.safetensors.1234abcd.tmp").write_bytes(b"half")
    (tmp_path / "hs_5.safetensors").write_bytes(b"garbage")
    done = []
    extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path), [1, 4], progress=False,
                          on_sample=done.append)
    assert done == [5] and not list(tmp_path.glob("*.tmp"))
    assert load_sample(tmp_path / "hs_5.safetensors")["token_ids"].tolist() == rendered[5].input_ids


def test_refuses_a_folder_with_other_settings_unless_overwrite(tiny_llama, rendered, tmp_path):
    extract_hidden_states(tiny_llama, rendered[:3], ExtractOptions(out=tmp_path), [1, 4], progress=False)
    with pytest.raises(WorkbenchError, match="other settings"):
        extract_hidden_states(tiny_llama, rendered[:3], ExtractOptions(out=tmp_path), [2, 4], progress=False)
    m = extract_hidden_states(tiny_llama, rendered[:3], ExtractOptions(out=tmp_path, overwrite=True), [2, 4],
                              progress=False)
    assert m["layer_ids"] == [2, 4] and m["samples"] == 3
    shifted = rendered[1:4]
    with pytest.raises(WorkbenchError, match="other tokens"):
        extract_hidden_states(tiny_llama, shifted, ExtractOptions(out=tmp_path), [2, 4], progress=False)


def test_foreign_samples_without_a_manifest_are_refused_not_deleted(tiny_llama, rendered, tmp_path):
    extract_hidden_states(tiny_llama, rendered[:2], ExtractOptions(out=tmp_path), [1, 2, 4], progress=False)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(WorkbenchError, match="not \\[T, 2, 64\\]"):
        extract_hidden_states(tiny_llama, rendered[:2], ExtractOptions(out=tmp_path), [1, 4], progress=False)
    assert len(list(tmp_path.glob("hs_*.safetensors"))) == 2


def test_refuses_when_the_disk_is_too_small(tiny_llama, rendered, tmp_path, monkeypatch):
    import engine.data.extract.run as ex

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(ex.shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(WorkbenchError, match="only 1000.0 B is free"):
        extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path), [1, 4], progress=False)
    assert not list(tmp_path.glob("hs_*"))


def test_a_locked_folder_is_refused(tiny_llama, rendered, tmp_path):
    with DirLock(tmp_path, "another job"):
        with pytest.raises(WorkbenchError, match="in use"):
            extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path), [1, 4], progress=False)


def test_non_finite_values_are_refused(tiny_llama, rendered, tmp_path, monkeypatch):
    import engine.data.extract.dataset as ex

    real = ex.capture_batch
    monkeypatch.setattr(ex, "capture_batch", lambda *a, **k: [h * float("inf") for h in real(*a, **k)])
    with pytest.raises(WorkbenchError, match="non-finite"):
        extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path), [1, 4], progress=False)
    assert not list(tmp_path.glob("hs_*")) and not list(tmp_path.glob("*.tmp"))


def test_plan_padded_batches_respects_budget_and_covers_everything():
    lengths = [5, 300, 40, 41, 39, 7, 1000, 12]
    batches = plan_padded_batches(lengths, batch_size=3, batch_tokens=200)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3 and (len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 200)
    assert batches[0] == [6]  # longest first, alone over budget


def test_online_dataset_yields_what_extraction_writes(tiny_llama, rendered, tmp_path):
    extract_hidden_states(tiny_llama, rendered, ExtractOptions(out=tmp_path, dtype="fp32"), [1, 4], progress=False)
    offline = HiddenStatesDataset(tmp_path)
    online = OnlineHiddenStates(tiny_llama, _rows(), [1, 4], max_length=200, dtype="fp32", batch_size=3)
    assert len(online) == len(offline) and online.lengths() == offline.lengths()
    by_iter = list(online)
    for k in range(len(offline)):
        a, b = offline[k], online[k]
        assert set(a) == set(b)
        torch.testing.assert_close(a["hidden_states"], b["hidden_states"], rtol=1e-4, atol=1e-5)
        assert torch.equal(a["token_ids"], b["token_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        torch.testing.assert_close(by_iter[k]["hidden_states"], a["hidden_states"], rtol=1e-4, atol=1e-5)
    fc = torch.nn.Linear(64, 3)
    fc(online[0]["hidden_states"]).sum().backward()  # usable in a training graph (not an inference tensor)
    many = online.get_many([4, 0, 2])
    assert [s["token_ids"].tolist() for s in many] == [rendered[i].input_ids for i in (4, 0, 2)]
    torch.testing.assert_close(online.token_freq(), offline.token_freq())
    shuffled = OnlineHiddenStates(tiny_llama, rendered, [1, 4], shuffle_seed=1)
    order0 = shuffled.order()
    shuffled.set_epoch(1)
    assert sorted(order0) == list(range(len(rendered))) and shuffled.order() != order0


def test_layer_id_choices():
    assert resolve_layer_ids(30, algo="eagle3") == [2, 15, 27, 30]
    assert resolve_layer_ids(30, algo="peagle") == [2, 15, 27, 30]
    assert resolve_layer_ids(30, "27,2,15") == [2, 15, 27]
    assert evenly_spaced_layer_ids(36) == [2, 10, 18, 26, 34]  # z-lab Qwen3-8B-DFlash target layers + 1
    assert resolve_layer_ids(36, algo="dflash") == [2, 10, 18, 26, 34, 36]
    assert resolve_layer_ids(30, algo="dspark") == [2, 9, 15, 22, 28, 30]
    with pytest.raises(WorkbenchError, match="outside 0..30"):
        resolve_layer_ids(30, "2,31")
    with pytest.raises(WorkbenchError, match="unknown algorithm"):
        resolve_layer_ids(30, algo="medusa")
    with pytest.raises(WorkbenchError, match="bad layer ids"):
        resolve_layer_ids(30, "2,x")


def test_cli_flags_come_from_the_options_model():
    from engine.commands import data as cmd
    from engine.data.extract import layer_ids
    from engine.data.options import ExtractOptions

    parser = argparse.ArgumentParser()
    cmd.add_extract_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    assert list(actions["algo"].choices) == layer_ids.layer_algorithms()  # derived from the registry, not copied
    assert list(actions["backend"].choices) == ["transformers", "vllm"]
    for name, field in ExtractOptions.model_fields.items():  # every field a flag, its default the model's
        assert name in actions and (field.is_required() or actions[name].default == field.default), name
        assert field.description in actions[name].help
