"""The CPU kind read from the flags, and the provenance every record writer puts into its JSON: the command (one the
CLI parses back into the same options), the CPU model and kind, the dtype, the day and the torch that measured."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from engine import cpu
from engine.provenance import FIELDS, command_of, provenance

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flags,kind", [
    ({"sse4_2", "avx", "avx2", "fma"}, "AVX2"),                                  # the AVX2-only AMD EPYC
    ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "AVX2"),                    # AVX-512 without BF16: emulated too
    ({"avx2", "avx512f", "avx512_bf16"}, "AVX-512 BF16"),                        # Zen 4, Cooper Lake
    ({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "AMX"),                 # Sapphire Rapids
    ({"avx2", "amx_tile"}, "AMX"),
    ({"fp", "asimd", "bf16"}, "other"),                                          # Arm
    ({"sse2"}, "other"),
])
def test_the_cpu_kind_is_read_from_the_flags(flags, kind):
    assert cpu.cpu_kind(frozenset(flags)) == kind
    assert kind in cpu.CPU_KINDS


def _fake_cpu(tmp_path, monkeypatch, model: str, flags: str) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: {model}\nflags\t\t: {flags}\n")
    monkeypatch.setattr(cpu, "_CPUINFO", info)


def test_every_record_names_the_model_and_the_kind_of_its_cpu(tmp_path, monkeypatch):
    _fake_cpu(tmp_path, monkeypatch, "AMD EPYC 9R14 96-Core Processor", "fpu avx2 avx512f avx512_bf16")
    assert cpu.cpu_identity() == {"cpu": "AMD EPYC 9R14 96-Core Processor", "cpu_kind": "AVX-512 BF16"}
    record = provenance("bf16", command="python -m engine bench --k 3")
    assert list(record) == list(FIELDS)
    assert record["cpu_kind"] == "AVX-512 BF16" and record["torch"] == torch.__version__
    assert record["dtype"] == "bf16" and record["date"] == time.strftime("%Y-%m-%d")
    several = provenance(["fp32", "bf16"])  # a record of several dtypes; the caller adds its command
    assert several["dtypes"] == ["fp32", "bf16"] and "command" not in several and "dtype" not in several
    on_gpu = provenance("bf16", on_cpu=False, torch_version="2.9.0+cu128")
    assert on_gpu["cpu"] is None and on_gpu["cpu_kind"] is None and on_gpu["torch"] == "2.9.0+cu128"


@pytest.mark.parametrize("text,kind", [("AMD EPYC (2 cores, AVX-512 BF16, native bf16)", "AVX-512 BF16"),
                                       ("Intel Xeon (AMX, AVX-512 BF16), 2-core VM", "AMX"),
                                       ("AMD EPYC (2 cores, AVX2, bf16 emulated)", "AVX2"),
                                       ("AMD EPYC, 2-core shared VM", None), (None, None)])
def test_the_kind_a_cpu_description_names(text, kind):
    assert cpu.kind_named(text) == kind


def test_the_evaluate_command_a_record_names_parses_back_into_the_same_options():
    """`command` is a command line the CLI takes: parsed again it gives the options the run had."""
    from engine.cli import build_parser
    from engine.commands.evaluate import _flags
    from engine.commands.flags import options_from_args
    from engine.measure.options import EvaluateOptions

    def options(args):
        return options_from_args(args, EvaluateOptions)

    argv = ["evaluate", "--draft", "d", "--k", "1-3", "--forecast", "--num-prompts", "4", "--json", "out.json"]
    args = build_parser().parse_args(argv)
    command = command_of("evaluate", _flags(options(args), args))
    assert command.startswith("python -m engine evaluate ") and "--walks" not in command
    again = build_parser().parse_args(command.split()[3:])
    assert options(again) == options(args) and options(args).k == [1, 2, 3]
    assert (again.json_out, again.write_card, again.write_k) == (args.json_out, args.write_card, args.write_k)
    with_data = build_parser().parse_args(["evaluate", "--data", "x"])
    assert "--dataset" not in command_of("evaluate", _flags(options(with_data), with_data))  # the two are exclusive


def test_a_vllm_record_names_the_torch_of_vllms_environment_and_no_cpu_for_a_gpu(monkeypatch):
    from engine.measure import vllm_bench
    from engine.serve import venv

    monkeypatch.setattr(venv, "read_stamp", lambda: venv.VllmEnv(Path("/x"), "cpu", "0.32.0", "2.13.0+cpu"))
    record = vllm_bench._machine("bfloat16")
    assert {k: record[k] for k in ("cpu", "cpu_kind", "dtype", "torch", "vllm_version")} == {
        **cpu.cpu_identity(), "dtype": "bfloat16", "torch": "2.13.0+cpu", "vllm_version": "0.32.0"}
    monkeypatch.setattr(venv, "read_stamp", lambda: venv.VllmEnv(Path("/x"), "cuda", "0.11.0", "2.9.0+cu128"))
    record = vllm_bench._machine("bfloat16")
    assert record["cpu"] is None and record["cpu_kind"] is None and record["torch"] == "2.9.0+cu128"


def test_a_benchmark_scripts_record_carries_its_provenance(tmp_path, capsys):
    sys.path.insert(0, str(ROOT))
    from benchmarks._results import command_line, print_and_save

    out = tmp_path / "r.json"
    result = {"command": command_line("bench_x.py", ["--json", str(out)]), "cpu": "its own description"}
    print_and_save(result, "| table |", str(out), dtype=["fp32", "bf16"])
    record = json.loads(out.read_text())
    assert record["command"] == f"python benchmarks/bench_x.py --json {out}"
    assert record["cpu"] == "its own description" and record["cpu_kind"] == cpu.cpu_kind()
    assert record["dtypes"] == ["fp32", "bf16"] and record["torch"] == torch.__version__
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"])
    with pytest.raises(ValueError, match="command and dtype"):
        print_and_save({"cpu": "x"}, "", str(out))


def test_the_ablation_zeroes_only_the_named_tensors_in_a_copy(tmp_path):
    """benchmarks/bench_ablate.py: the named tensors zeroed in the copy, every other tensor and file as it was, the
    draft itself untouched; a name matching nothing is refused."""
    import torch
    from safetensors.torch import load_file, save_file

    from benchmarks.bench_ablate import zeroed_copy

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    tensors = {"candidate_selector.successor_codebook": torch.ones(4, 2), "layers.0.w": torch.full((2, 2), 3.0)}
    save_file(tensors, draft / "model.safetensors")
    zeroed = zeroed_copy(draft, ["successor_codebook"], tmp_path / "copy")
    assert zeroed == ["candidate_selector.successor_codebook"]
    copy, original = load_file(tmp_path / "copy" / "model.safetensors"), load_file(draft / "model.safetensors")
    name = "candidate_selector.successor_codebook"
    assert not copy[name].any() and original[name].all()
    assert torch.equal(copy["layers.0.w"], tensors["layers.0.w"]) and (tmp_path / "copy" / "config.json").is_file()
    with pytest.raises(SystemExit, match="no tensor"):
        zeroed_copy(draft, ["nothing_like_this"], tmp_path / "copy2")
