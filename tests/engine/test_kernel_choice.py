"""Native bf16 detection from CPU flags, and the kernel path chosen by measurement: the fastest row-exact one, cached
per CPU, torch and target, re-measured when any of them changes, and greedy-exact on the built-in target."""

from __future__ import annotations

import pytest
import torch

from engine import cpu
from engine.errors import WorkbenchError
from engine.generate import kernel_choice as kc


@pytest.mark.parametrize("machine,flags,native", [
    ("x86_64", {"sse4_2", "avx", "avx2", "fma"}, False),                         # this AMD EPYC: AVX2 only
    ("x86_64", {"avx2", "avx512f", "avx512bw", "avx512_vnni"}, False),           # AVX-512 without BF16: emulated
    ("x86_64", {"avx2", "avx512f", "avx512_bf16"}, True),                        # Zen 4, Cooper Lake
    ("x86_64", {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, True),        # Sapphire Rapids
    ("x86_64", {"amx_tile", "amx_bf16"}, True),
    ("aarch64", {"fp", "asimd", "sve"}, False),                                  # Neoverse N1 / Graviton2
    ("aarch64", {"fp", "asimd", "bf16", "i8mm"}, True),                          # Armv8.6 BF16
    ("aarch64", {"sve", "svebf16"}, True),
    ("riscv64", {"bf16"}, False),
])
def test_native_bf16_is_read_from_the_cpu_flags(machine, flags, native):
    assert cpu.native_bf16(frozenset(flags), machine) is native


def test_cpuinfo_is_parsed_and_decode_dtype_ignores_onednn_emulation(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
                    "flags\t\t: fpu sse2 avx2 avx512f avx512bw\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
    monkeypatch.setattr(cpu, "_CPUINFO", info)
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    assert cpu.cpu_model() == "AMD EPYC 9R14"
    assert cpu.cpu_flags() == {"fpu", "sse2", "avx2", "avx512f", "avx512bw"}
    assert not cpu.native_bf16()
    assert "AVX-512" in cpu.describe() and "bf16 emulated" in cpu.describe()
    from engine.targets.dtypes import decode_dtype

    assert decode_dtype("auto", "cpu") == torch.float32  # whatever oneDNN says about emulating bf16 here
    info.write_text("model name\t: Intel Xeon\nflags\t\t: avx512f avx512_bf16 amx_bf16\n")
    assert decode_dtype("auto", "cpu") == torch.bfloat16
    assert decode_dtype("fp32", "cpu") == torch.float32 and decode_dtype("bf16", "cpu") == torch.bfloat16


def test_pick_takes_the_fastest_exact_candidate():
    fast_broken = {"row_exact": False, "ms_1": 10.0, "ms_k1": 12.0}
    slow_exact = {"row_exact": True, "ms_1": 40.0, "ms_k1": 50.0}
    slower_exact = {"row_exact": True, "ms_1": 45.0, "ms_k1": 60.0}
    assert kc.pick({"a": fast_broken, "b": slower_exact, "c": slow_exact}) == "c"
    assert kc.pick({"a": {**fast_broken, "row_exact": True}, "c": slow_exact}) == "a"
    # nothing exact: the fastest of all (lossless in distribution, labelled so), not a slower inexact fp32
    assert kc.pick({"fp32": {**slow_exact, "row_exact": False}, "a": fast_broken}) == "a"
    assert kc.pick({}) == "fp32"  # nothing timed
    # `fastest`: the fastest whether exact or not
    assert kc.pick({"a": fast_broken, "b": slower_exact, "c": slow_exact}, "fastest") == "a"


def test_the_summary_says_whether_the_chosen_path_is_bit_identical_or_only_lossless():
    base = dict(source="measured", k=3, cpu="X", torch="t", native_bf16=True)
    exact = {"row_exact": True, "ms_1": 40.0, "ms_k1": 50.0}
    broken = {"row_exact": False, "ms_1": 10.0, "ms_k1": 12.0}
    chosen = kc.Choice(path="fp32", candidates={"fp32": exact, "bf16-plain": broken}, **base)
    assert chosen.row_exact is True and kc.EXACT_LABEL in chosen.summary()
    chosen = kc.Choice(path="bf16-plain", candidates={"fp32": exact, "bf16-plain": broken}, mode="fastest", **base)
    assert chosen.row_exact is False and kc.LOSSLESS_LABEL in chosen.summary()
    assert "not bit-identical" in chosen.summary()
    assert kc.Choice(path="fp32", **{**base, "source": "forced"}).row_exact is None


def _rows_leak(model):
    """Breaks row invariance: the final norm's output depends on how many rows the forward holds."""
    norm = model.get_decoder().norm
    norm.register_forward_hook(lambda mod, args, out: out + 1e-3 * out.shape[1])


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setattr(kc, "cache_dir", lambda: tmp_path / "kernels")
    return tmp_path / "kernels"


@pytest.fixture
def counted(monkeypatch):
    """kc.measure as it is, counted; the 'sloppy' path reported 10x faster than measured (the simulated fast path)."""
    calls = []
    real = kc.measure

    def measure(*args, **kwargs):
        calls.append(args)
        out = real(*args, **kwargs)
        if "sloppy" in out:
            out["sloppy"].update(ms_1=out["sloppy"]["ms_1"] / 10, ms_k1=out["sloppy"]["ms_k1"] / 10)
        return out

    monkeypatch.setattr(kc, "measure", measure)
    return calls


def test_a_fast_path_that_is_not_row_exact_loses_to_a_slower_exact_one(tiny_targets, cache_home, counted,
                                                                      monkeypatch):
    sloppy = kc.KernelPath("sloppy", torch.float32, False, False, "fp32 with a row-count dependent norm", _rows_leak)
    monkeypatch.setitem(kc.PATHS, "sloppy", sloppy)
    monkeypatch.setattr(kc, "native_bf16", lambda: False)
    choice = kc.choose(str(tiny_targets["llama"]), device="cpu")
    assert choice.source == "measured"
    assert choice.candidates["sloppy"]["row_exact"] is False  # the check really ran and caught it
    assert choice.candidates["sloppy"]["ms_1"] < choice.candidates["fp32"]["ms_1"]
    # the fastest exact one wins (plain fp32 is not row-exact on every CPU: then its routed form)
    exact = [n for n, c in choice.candidates.items() if c.get("row_exact")]
    cost = {n: c["ms_1"] + c["ms_k1"] for n, c in choice.candidates.items() if c.get("ms_1") is not None}
    if exact:
        assert choice.path != "sloppy" and choice.path == min(exact, key=cost.get) and choice.row_exact
    else:  # on the AMD EPYC with AVX2 only no fp32 form is row-exact either: the fastest of all, labelled lossless
        assert choice.path == "sloppy" and kc.LOSSLESS_LABEL in choice.summary()
    assert "bf16-routed" in choice.candidates and choice.candidates["bf16-routed"]["skipped"]  # emulated: not tried
    assert "NOT row-exact" in choice.summary() and "not tried" in choice.summary()
    # one flag away: `fastest` takes the sloppy path from the same cached measurement, labelled as not bit-identical
    fastest = kc.choose(str(tiny_targets["llama"]), "fastest", device="cpu")
    assert (fastest.path, fastest.source, fastest.mode, len(counted)) == ("sloppy", "cached", "fastest", 1)
    assert fastest.row_exact is False and kc.LOSSLESS_LABEL in fastest.summary()
    assert kc.choose(str(tiny_targets["llama"]), device="cpu").path == choice.path  # auto again: unchanged


def test_the_decision_is_cached_and_measured_again_when_torch_or_the_cpu_changes(tiny_targets, cache_home, counted,
                                                                              monkeypatch):
    monkeypatch.setattr(kc, "native_bf16", lambda: False)
    name = str(tiny_targets["llama"])
    first = kc.choose(name, device="cpu")
    assert first.source == "measured" and len(counted) == 1 and len(list(cache_home.glob("*.json"))) == 1
    again = kc.choose(name, device="cpu")
    assert again.source == "cached" and again.path == first.path and len(counted) == 1
    assert again.candidates == first.candidates
    monkeypatch.setattr(kc.torch, "__version__", "99.0.0")
    assert kc.choose(name, device="cpu").source == "measured" and len(counted) == 2
    monkeypatch.setattr(kc, "cpu_model", lambda: "Some Other CPU")
    assert kc.choose(name, device="cpu").source == "measured" and len(counted) == 3
    assert kc.choose(name, device="cpu").source == "cached" and len(counted) == 3
    assert kc.choose(str(tiny_targets["qwen3"]), device="cpu").source == "measured"  # another target
    assert len(list(cache_home.glob("*.json"))) == 4


def test_forced_choices_measure_nothing(tiny_targets, cache_home, counted):
    name = str(tiny_targets["llama"])
    for spelling, path in [("fp32", "fp32"), ("float32", "fp32"), ("bf16", "bf16-routed"),
                           ("bfloat16", "bf16-routed"), (torch.bfloat16, "bf16-routed")]:
        forced = kc.choose(name, spelling)
        assert (forced.path, forced.source) == (path, "forced")
    with pytest.raises(WorkbenchError, match="unknown decode dtype"):
        kc.choose(name, "int8")
    assert not counted and not cache_home.exists()
    target = kc.load_decode_target(name, "fp32", device="cpu")
    assert target.dtype == torch.float32 and target.extra["kernel"]["source"] == "forced"


@pytest.mark.parametrize("share,loaded", [(0.45, True), (0.02, False)])
def test_the_load_while_the_paths_were_timed_is_recorded_with_the_choice(tiny_targets, cache_home, monkeypatch,
                                                                         share, loaded):
    """Issue 65: a choice made from timings taken while other processes kept the CPUs busy says so, cached too."""

    class Busy:
        def share(self):
            return share

    timed = {"fp32": {"row_exact": True, "ms_1": 223.0, "ms_k1": 400.0},
             "fp32-fused-packed-masked": {"row_exact": True, "ms_1": 311.0, "ms_k1": 250.0}}
    monkeypatch.setattr(kc, "OtherLoad", Busy)
    monkeypatch.setattr(kc, "measure", lambda *args, **kwargs: {n: dict(c) for n, c in timed.items()})
    monkeypatch.setattr(kc, "native_bf16", lambda: False)
    name = str(tiny_targets["llama"])
    choice = kc.choose(name, device="cpu")
    assert choice.path == "fp32-fused-packed-masked"  # the fastest step plus verification, not per token
    assert (choice.other_load, choice.loaded) == (share, loaded)
    assert ("measured under load (other processes used 45% of the CPUs)" in choice.summary()) is loaded
    cached = kc.read_cached(name)
    assert (cached.other_load, cached.loaded, "under load" in cached.summary()) == (share, loaded, loaded)
    assert kc.choose(name, "fp32").loaded is loaded  # a forced path shows the same measurement


@pytest.fixture(scope="module")
def builtin_chosen(tmp_path_factory):
    """The built-in target on the path measured here (the cache kept out of the user's home)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(kc, "cache_dir", lambda: tmp_path_factory.mktemp("kernels"))
    yield kc.load_decode_target("smollm2-135m-instruct", device="cpu")
    mp.undo()


# How far apart the target's two best logits may be where greedy speculation on a path that is not row-exact
# leaves the baseline: several rows in one forward round differently from one-token steps, by fp32 (bf16) rounding
NEAR_TIE = {torch.float32: 1e-3, torch.bfloat16: 0.25}


def test_the_chosen_path_on_the_builtin_target_is_greedy_exact(builtin_chosen):
    """On a row-exact path greedy speculation is the baseline token for token; on a path that is not (the AMD EPYC
    with AVX2 only: none is), it is the baseline up to a near-tie: where they first differ, the baseline's own
    one-token step scores both tokens within rounding."""
    from engine.algos.loading import make_proposer
    from engine.data.render.datasets import heldout_prompts
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all

    target = builtin_chosen
    decided = target.extra["kernel"]
    assert decided["source"] == "measured"
    exact = [n for n, c in decided["candidates"].items() if c.get("row_exact")]
    # the chosen path passed the bitwise row check, or none did (then the fastest, labelled lossless in distribution)
    assert decided["path"] in exact if exact else decided["candidates"][decided["path"]]["row_exact"] is False
    if not cpu.native_bf16():
        assert kc.PATHS[decided["path"]].dtype == torch.float32  # emulated bf16 is never chosen
    params = SamplingParams(max_new_tokens=24, eos_token_ids=[target.tokenizer.eos_token_id])
    proposer = make_proposer("draft", target)
    base_runner, spec_runner = TargetRunner(target), TargetRunner(target, proposer.aux_layer_ids)
    assert spec_runner.routed == kc.PATHS[decided["path"]].routed
    accepted = 0
    for prompt in heldout_prompts("sharegpt", n=4, max_chars=600):
        ids = prompt_ids(target.tokenizer, prompt)
        base = generate_all(base_runner, ids, params)[0]
        out, events = generate_all(spec_runner, ids, params, proposer, k=3)
        if exact:
            assert out == base, f"{decided['path']}: speculative output differs from the baseline"
        else:
            assert_equal_up_to_a_near_tie(base_runner, ids, base, out, NEAR_TIE[kc.PATHS[decided["path"]].dtype])
        accepted += sum(e.accepted for e in events)
    assert accepted > 0


def assert_equal_up_to_a_near_tie(runner, ids, base, out, tie) -> None:
    """`out` is `base`, or first differs from it where the baseline's one-token step puts both tokens within `tie`
    (and the baseline's token is that step's argmax)."""
    i = next((j for j, (a, b) in enumerate(zip(base, out, strict=False)) if a != b), None)  # lengths: below
    if i is None:
        assert len(out) == len(base), (len(out), len(base))
        return
    runner.reset()
    logits, _ = runner.forward(ids, all_logits=False)  # the baseline's own steps: prefill, then one token each
    for token in base[:i]:
        logits, _ = runner.forward([token])
    step = logits[-1].float()
    assert int(step.argmax()) == base[i]
    margin = float(step[base[i]] - step[out[i]])
    assert margin <= tie, f"speculative output leaves the baseline at token {i} with a logit margin of {margin}"


@pytest.mark.parametrize("path_name", list(kc.PATHS))
def test_sampling_on_every_kernel_path_keeps_the_target_distribution(tiny_targets, path_name):
    """The lossless-in-distribution claim for paths that are not row-exact (and for the exact ones): at temperature 1
    the second token, verified from a draft, follows the target's distribution on that path (chi-square), as vLLM's
    rejection-sampler tests check it."""
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all
    from engine.targets.loading import load_target
    from testkit.decoding import OracleProposer, chi_square_pvalue, second_token_distribution

    path = kc.PATHS[path_name]
    if path.native_bf16_only and not cpu.native_bf16():
        pytest.skip(f"{path_name} runs only on a CPU with native bf16; this one emulates it")
    target = load_target(str(tiny_targets["llama"]), dtype=path.dtype, device="cpu")
    path.prepare(target.model)
    runner = TargetRunner(target, route_kernels=path.routed, fused=path.fused)  # the path as decoding runs it
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=40)
    prompt = prompt_ids(target.tokenizer, "hello")
    exact = second_token_distribution(target, prompt, params).float()
    counts = torch.zeros(target.vocab_size)
    proposer, accepted = OracleProposer(target), 0
    for seed in range(800):
        params.seed = seed
        out, events = generate_all(runner, prompt, params, proposer, k=1)
        assert events[1].drafted == 1  # the second token is verified from a draft
        counts[out[1]] += 1
        accepted += events[1].accepted
    assert accepted > 0
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_candidates_are_timed_one_at_a_time_when_their_copies_do_not_fit_together(tiny_targets, monkeypatch):
    """The large-target branch of `measure` (one model at a time) gives what the interleaved one gives."""
    target, paths = str(tiny_targets["llama"]), ["fp32", "fp32-routed"]
    monkeypatch.setattr(kc, "INTERLEAVE_MEMORY_SHARE", 0.0)
    alone = kc.measure(target, 3, paths, device="cpu", repeats=2)
    monkeypatch.setattr(kc, "INTERLEAVE_MEMORY_SHARE", 1.0)
    together = kc.measure(target, 3, paths, device="cpu", repeats=2)
    assert list(alone) == list(together) == paths
    assert not any(c["interleaved"] for c in alone.values()) and all(c["interleaved"] for c in together.values())
    for name in paths:
        assert alone[name]["row_exact"] == together[name]["row_exact"]
        assert alone[name]["ms_1"] > 0 and alone[name]["ms_k1"] > 0


def test_a_draft_loads_in_its_cpu_targets_bf16_and_in_fp32_otherwise(builtin_target):
    from engine.algos.loading import load_draft
    from engine.algos.shipped import default_draft
    from engine.targets.loading import load_target

    path = default_draft(builtin_target.ref.name)
    assert load_draft(path, builtin_target).fc.weight.dtype == torch.float32  # fp32 target
    bf16 = load_target("smollm2-135m-instruct", dtype="bf16", device="cpu", with_tokenizer=False)
    assert load_draft(path, bf16).fc.weight.dtype == torch.bfloat16
    assert load_draft(path, bf16, dtype=torch.float32).fc.weight.dtype == torch.float32  # as asked
