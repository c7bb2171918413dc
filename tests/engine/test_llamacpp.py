"""Real llama.cpp (llama-server built once from the pinned source): every draft type it runs, exported by its own
converter and served beside the target, decodes exactly the baseline's greedy tokens; the shipped drafts accept what
the decoding-exact evaluator says they will; `serve --engine llama.cpp` serves, and bad inputs are named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import WorkbenchError
from engine.llamacpp.build import ensure_llamacpp
from engine.llamacpp.gguf import export_draft, target_gguf
from engine.llamacpp.server import LlamaPlan, LlamaServer

pytestmark = pytest.mark.llamacpp

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "assets" / "drafts"
K = 3
PROMPTS = 6  # general questions (engine/data/prompts/general.jsonl), in no draft's training data
TOKENS = 48
NEAR_TIE = 0.02  # nats between the baseline's two likeliest tokens where an answer may leave it


@pytest.fixture(scope="module")
def build():
    return ensure_llamacpp()  # `make test` builds it first (make llamacpp); minutes, once, if not


@pytest.fixture(scope="module")
def builtin_dir():
    from engine.targets.resolve import resolve_target

    return resolve_target("smollm2-135m-instruct").path


@pytest.fixture(scope="module")
def prompt_ids(builtin_dir):
    from transformers import AutoTokenizer

    from engine.data.prompts.load import load_prompts
    from engine.generate.prompt import prompt_ids

    tok = AutoTokenizer.from_pretrained(builtin_dir)
    return [prompt_ids(tok, p) for p in load_prompts("general", PROMPTS)]


def _answers(plan: LlamaPlan, build, prompts: list[list[int]], tokens: int = TOKENS):
    with LlamaServer(plan, build=build) as server:
        client = server.client()
        return [client.complete(ids, max_tokens=tokens) for ids in prompts]


@pytest.fixture(scope="module")
def builtin_baseline(build, builtin_dir, prompt_ids):
    """The target alone in llama-server: its answers, and the server (kept for the near-tie checks)."""
    with LlamaServer(LlamaPlan(target_gguf(builtin_dir, build=build)), build=build) as server:
        client = server.client()
        yield client, [client.complete(ids, max_tokens=TOKENS) for ids in prompt_ids]


def _lossless(base_client, prompts, answers, baseline) -> None:
    """Each answer is the baseline's, or leaves it only where the target's two likeliest tokens are tied to float
    rounding (llama.cpp verifies k + 1 tokens in one batch, whose sums round unlike one-token steps)."""
    from engine.measure.llamacpp_bench import divergence_gaps

    gaps = divergence_gaps(base_client, prompts, {"baseline": baseline, "spec": answers})["spec"]
    for a, b, gap in zip(answers, baseline, gaps, strict=True):
        assert a.token_ids == b.token_ids or (gap is not None and abs(gap) < NEAR_TIE), gap


def _evaluated_tau(draft: Path) -> float:
    from engine.measure.evaluate import evaluate_draft
    from engine.measure.options import EvaluateOptions

    result = evaluate_draft(EvaluateOptions(draft=str(draft), dataset="general", num_prompts=PROMPTS,
                                            max_new_tokens=TOKENS, k=[K], dtype="float32"), progress=False)
    return result["by_k"][str(K)]["mean_acceptance_length"]


@pytest.mark.parametrize("name", ["eagle3", "dflash", "dflash2"])
def test_a_shipped_draft_decodes_the_baseline_and_accepts_as_evaluated(name, build, builtin_dir, prompt_ids,
                                                                       builtin_baseline):
    from engine.commands.serve_llamacpp import plan_llamacpp
    from engine.serve.options import ServeOptions

    draft = SHIPPED / f"smollm2-135m-instruct-{name}"
    plan = plan_llamacpp(ServeOptions(engine="llama.cpp", draft=str(draft), k=K))  # what `serve` would start
    assert plan.k == K and plan.spec_types == (("draft-eagle3",) if name == "eagle3" else ("draft-dflash",))
    answers = _answers(plan, build, prompt_ids)
    base_client, baseline = builtin_baseline
    _lossless(base_client, prompt_ids, answers, baseline)
    steps, accepted = sum(a.draft_steps for a in answers), sum(a.draft_accepted for a in answers)
    assert steps > 0 and 0 < accepted <= K * steps  # drafts both accepted and rejected
    assert accepted < K * steps
    tau = 1 + accepted / steps
    assert tau == pytest.approx(_evaluated_tau(draft), abs=0.05)


def test_serve_starts_llama_server_as_a_job_that_answers_and_stops(build):
    from engine.jobs import load_job, stop
    from engine.llamacpp.server import LlamaClient

    draft = SHIPPED / "smollm2-135m-instruct-eagle3"
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--engine", "llama.cpp", "--draft", str(draft),
                          "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        assert info["ready"] and info["spec_types"] == ["draft-eagle3"] and info["k"] == 3
        line = info["llama_server"]
        assert line.startswith("llama-server -m ") and "--spec-type draft-eagle3" in line
        answer = LlamaClient(info["url"]).complete("Name three colours.", max_tokens=12)
        assert answer.tokens > 0 and answer.draft_n > 0
    finally:
        job = load_job(ROOT / "runs" / info["job"])
        stop(job)


def test_a_type_llama_cpp_does_not_run_is_refused_before_building(tmp_path):
    cfg = json.loads((SHIPPED / "smollm2-135m-instruct-eagle3" / "config.json").read_text())
    cfg["speculators_model_type"] = "peagle"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = subprocess.run([sys.executable, "-m", "engine", "export", str(tmp_path), "--out", str(tmp_path / "x.gguf")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and "llama.cpp cannot run this peagle draft" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "x.gguf").exists()


# -- a tiny target of another size, and a trained DSpark draft -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_smol(tmp_path_factory, builtin_dir):
    """A tiny random Llama with the built-in's tokenizer (llama.cpp's converter knows its pre-tokenizer), of 8 layers
    (EAGLE-3's default three target layers are distinct from 7 on; llama.cpp reads exactly three)."""
    from transformers import AutoTokenizer

    from engine.fsutil import atomic_directory
    from tiny import tiny_model

    folder = tmp_path_factory.mktemp("tiny-smol") / "target"
    model = tiny_model("llama", vocab_size=49152, num_layers=8, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    with atomic_directory(folder) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(builtin_dir).save_pretrained(tmp)
    return folder


@pytest.mark.parametrize("algo, args", [("eagle3", {}),
                                        ("dspark", {"num_layers": 1, "block_size": 4, "markov_rank": 16})])
def test_a_trained_draft_of_a_tiny_target_decodes_its_baseline(algo, args, build, tiny_smol, tmp_path):
    from transformers import AutoTokenizer

    from engine.data.prompts.load import load_prompts
    from engine.generate.prompt import prompt_ids
    from testkit.training import train_online

    draft, _ = train_online(algo, tiny_smol, tmp_path / "run", epochs=2, **args)
    tok = AutoTokenizer.from_pretrained(tiny_smol)
    prompts = [prompt_ids(tok, p) for p in load_prompts("general", 4)]
    exported = export_draft(draft, target=str(tiny_smol), build=build)
    target = target_gguf(str(tiny_smol), build=build)
    base = _answers(LlamaPlan(target), build, prompts, tokens=32)
    spec = _answers(LlamaPlan(target, exported.path, (exported.spec_type,), k=exported.k), build, prompts, tokens=32)
    assert exported.spec_type == f"draft-{algo}"
    assert [a.token_ids for a in spec] == [b.token_ids for b in base]
    assert sum(a.draft_n for a in spec) > 0


def test_a_tokenizer_llama_cpp_does_not_know_is_named(build, tiny_targets):
    with pytest.raises(WorkbenchError, match="pre-tokenizer was not recognized"):
        target_gguf(str(tiny_targets["llama"]), build=build)


def test_a_server_that_cannot_load_the_draft_says_why(build, builtin_dir, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    server = LlamaServer(LlamaPlan(target_gguf(builtin_dir, build=build), broken, ("draft-eagle3",), k=3),
                         build=build, workdir=tmp_path / "server")
    with pytest.raises(WorkbenchError, match=r"exited with code \d+ before it was ready(.|\n)*llama.cpp says:"
                                             r"(.|\n)*failed to load") as caught:
        server.start().wait_ready(timeout=120)
    assert str(server.log_path) in str(caught.value) and not server.running()
