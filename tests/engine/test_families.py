"""Every target family a tiny random checkpoint of can be built offline goes end to end with every registered
algorithm: extract -> train (the target followed from the data) -> validate -> evaluate -> greedy generation
identical to the target alone. A fast subset runs by default; the whole matrix is `slow`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.algos import ALGOS, default_algo
from testkit.cli import run_cli
from testkit.docs import families_table
from tiny import FAMILIES, PROBE_FAMILIES, algo_flags, save_tiny_target

PROMPT = "Tell me about the quick brown fox."
FAST_FAMILY = "llama"


def _cells() -> list:
    """(family, algorithm) pairs: every family with the default algorithm and every algorithm with one family run
    by default; the rest of the matrix is marked slow."""
    fast = {(f, default_algo()) for f in FAMILIES} | {(FAST_FAMILY, a) for a in ALGOS.names()}
    return [pytest.param(f, a, id=f"{f}-{a}", marks=() if (f, a) in fast else pytest.mark.slow)
            for f in FAMILIES for a in ALGOS.names()]


@pytest.fixture(scope="module")
def family_targets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: save_tiny_target(root / f, f) for f in FAMILIES}


def _small_args(algo: str, family: str = FAST_FAMILY) -> list[str]:
    """Arguments that keep any algorithm's draft tiny, given only where that algorithm has the field. Beside Gemma 4,
    DSpark keeps the full vocabulary, so that its cells run the layout of vLLM's Gemma 4 class (which has no draft
    vocabulary), not the Qwen3 layers auto falls back to."""
    vocab = {} if algo == "dspark" and family.startswith("gemma4") else {"draft_vocab_size": "160"}
    return algo_flags(algo, {"num_layers": "1", **vocab, "block_size": "4", "markov_rank": "16", "max_anchors": "32"})


def _tokens(stdout: str) -> tuple[list[int], int]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [t for e in events for t in e["tokens"]], sum(e.get("drafted", 0) for e in events)


@pytest.mark.parametrize("family,algo", _cells())
def test_family_goes_end_to_end_with_algorithm(family, algo, family_targets, tmp_path, capsys):
    from engine.data.extract.layer_ids import layer_algorithms

    target = str(family_targets[family])
    data = tmp_path / "hs"
    layer_flag = ["--algo", algo] if algo in layer_algorithms() else []
    rc, _, err = run_cli(capsys, "extract", "--target", target, "--dataset", "sharegpt", "--max-samples", "10",
                         "--max-length", "64", "--dtype", "fp32", *layer_flag, "--out", str(data))
    assert rc == 0, err[-2000:]

    # train on the data alone: the target comes from its manifest (the bug was: the built-in target was loaded)
    run = tmp_path / "run"
    rc, out, err = run_cli(capsys, "train", "--data", str(data), "--algo", algo, "--max-steps", "3",
                           "--tokens-per-batch", "256", "--warmup-steps", "1", "--val-fraction", "0.2",
                           "--val-every", "3", *_small_args(algo, family), "--out", str(run))
    assert rc == 0, err[-2000:]
    assert "validate: OK" in out
    draft = run / "draft"
    config = json.loads((draft / "config.json").read_text())
    verifier = config["speculators_config"]["verifier"]
    if algo == "dspark" and family.startswith("gemma4"):
        assert config["transformer_layer_config"]["model_type"] == "gemma4_text"  # vLLM's Gemma 4 DSpark layout
    assert Path(verifier["name_or_path"]).resolve() == Path(target).resolve()

    rc, out, err = run_cli(capsys, "validate", str(draft))
    assert rc == 0 and "OK" in out, out + err

    # evaluate and generate without --target: the draft's verifier is used
    rc, out, err = run_cli(capsys, "evaluate", "--draft", str(draft), "--num-prompts", "2", "--max-new-tokens", "12",
                           "--k", "1,2", "--dtype", "fp32")
    assert rc == 0, err[-2000:]
    assert "held-out samples" in out

    common = ["--max-new-tokens", "24", "--k", "3", "--dtype", "fp32", "--events"]
    rc, out, err = run_cli(capsys, "generate", PROMPT, "--method", "baseline", "--target", target, *common)
    assert rc == 0, err[-2000:]
    baseline, _ = _tokens(out)
    rc, out, err = run_cli(capsys, "generate", PROMPT, "--method", "draft", "--draft", str(draft), *common)
    assert rc == 0, err[-2000:]
    speculative, drafted = _tokens(out)
    assert len(baseline) > 0 and speculative == baseline  # lossless: the target's own greedy output
    assert drafted > 0, "the draft never proposed a token"


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def test_linear_attention_targets_decode_losslessly(family, tmp_path):
    """Gated DeltaNet layers keep a recurrent state that a crop cannot shorten: the runner restores it from before
    the verify and runs the kept tokens again. Drafts accepted 0..k at a time leave the output the baseline's; a
    runner that only crops attention KV changes it (this target's greedy output is varied, not one token)."""
    from engine.generate.prompt import prompt_ids
    from engine.generate.runner import TargetRunner, rollback_problem
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate_all
    from engine.targets.loading import load_target
    from testkit.decoding import PROMPTS, OracleProposer

    target = load_target(str(save_tiny_target(tmp_path / family, family)), dtype="fp32")
    assert rollback_problem(target) is None
    params = SamplingParams(max_new_tokens=20)
    for text in PROMPTS[:2]:
        ids = prompt_ids(target.tokenizer, text)
        base, _ = generate_all(TargetRunner(target), ids, params, None, 3, target.tokenizer)
        assert len(set(base)) >= 5, base  # a non-degenerate continuation: a wrong state would show
        proposer = OracleProposer(target, cycle=True)
        out, events = generate_all(TargetRunner(target), ids, params, proposer, 3, target.tokenizer)
        assert out == base, text
        assert {e.accepted for e in events[1:-1]} >= {0, 1, 2}  # rollbacks of every length ran


def test_a_rollback_past_the_last_forward_replays_the_kept_tokens(tmp_path):
    """A crop to before the last forward (one-token steps, then back to the prompt) rebuilds the recurrent state
    from the kept tokens: the logits after it equal a fresh pass's."""
    import torch

    from engine.generate.runner import TargetRunner
    from engine.targets.loading import load_target

    target = load_target(str(save_tiny_target(tmp_path / "q", "qwen3_next")),
                         dtype="fp32")
    ids = [(5 * i + 3) % 300 for i in range(10)]
    runner = TargetRunner(target)
    runner.forward(ids[:6])
    for t in ids[6:9]:
        runner.forward([t])
    runner.crop(6)
    assert runner.length == 6
    after, _ = runner.forward(ids[6:])
    fresh, _ = TargetRunner(target).forward(ids)
    torch.testing.assert_close(after, fresh[6:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family,config,expected", [
    ("deepseek_v3:gqa", {}, "refused"),
    ("deepseek_v3:gqa", {"qk_rope_head_dim": 4}, "broken"),  # unlike head_dim: transformers' MLA fails
])
def test_targets_whose_cache_cannot_roll_back_are_refused(family, config, expected, tmp_path, capsys):
    """Speculative decoding is refused, with the measured reason, where a multi-token verify and a crop do not
    give the logits of one-token steps (DeepSeek-V3 with fewer KV heads than heads, where transformers' cached
    multi-token step fails); a target whose transformers model fails on any forward is named as such, not as a bug
    of ours."""
    target = str(save_tiny_target(tmp_path / family, family, **config))
    common = ["--max-new-tokens", "16", "--k", "3", "--dtype", "fp32", "--events", "--target", target]
    if expected == "broken":
        rc, _, err = run_cli(capsys, "extract", "--target", target, "--max-samples", "8", "--max-length", "64",
                             "--dtype", "fp32", "--out", str(tmp_path / "hs"))
        assert rc == 2 and f"transformers' {family.split(':')[0]} model fails on this target" in err, err[-2000:]
        return
    rc, _, err = run_cli(capsys, "generate", PROMPT, "--method", "baseline", *common)
    assert rc == 0, err[-2000:]  # the target alone decodes
    rc, _, err = run_cli(capsys, "generate", PROMPT, "--method", "ngram", *common)
    assert rc == 2 and "speculative decoding would not be lossless here" in err, err[-2000:]
    assert "unexpected" not in err


def test_the_families_table_says_how_each_in_process_cell_is_tested():
    """docs/families.md: a row per family of the matrix (and per refused target), a column per registered
    algorithm; a cell says "verified" exactly where its end-to-end test runs by default, "verified (slow)" where it
    is marked slow, and "refused" for the targets the rollback guard refuses."""
    header, rows = families_table()
    titles = {ALGOS.get(name).title: name for name in ALGOS.names()}
    algos = [titles[h.removesuffix(" in-process")] for h in header[1:-1]]
    assert sorted(algos) == sorted(ALGOS.names())
    slow = {tuple(cell.values) for cell in _cells() if cell.marks}
    assert set(rows) == set(FAMILIES) | set(PROBE_FAMILIES)
    for family, cells in rows.items():
        for algo, cell in zip(algos, cells[1:-1], strict=True):
            if family not in FAMILIES:
                assert cell.startswith("refused"), (family, algo, cell)
            else:
                assert cell == ("verified (slow)" if (family, algo) in slow else "verified"), (family, algo, cell)
