"""vLLM's SpeculativeConfig rules for the speculative-config fields beyond method and num_speculative_tokens."""

from __future__ import annotations

import pytest

from engine.format.vllm_rules import (
    LOSSY_REJECTION_METHODS,
    VllmError,
    check_dynamic_sd_schedule,
    check_speculative_config,
    lossy_reason,
)

DSPARK_HF = {"architectures": ["Qwen3DSparkModel"], "vocab_size": 1000, "draft_vocab_size": 32}


def spec(method: str | None = "eagle3", **fields) -> dict:
    out = {"num_speculative_tokens": 3, **fields}
    return out if method is None else {"method": method, **out}


ACCEPTED = [
    pytest.param(spec(rejection_sample_method="standard"), None, id="standard"),
    pytest.param(spec(rejection_sample_method="block"), None, id="block"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.9, 0.8, 0.8]), None,
                 id="synthetic-rates"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[1, 1, 0]), None,
                 id="synthetic-rates-bounds"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=4), None,
                 id="synthetic-length-max"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=1.0), None,
                 id="synthetic-length-min"),
    pytest.param(spec(enable_adaptive_verification=True), None, id="adaptive"),
    pytest.param(spec("dspark", enable_adaptive_verification=True, use_local_argmax_reduction=True), None,
                 id="adaptive-dspark-local-argmax"),
    pytest.param(spec(enable_adaptive_verification="yes"), None, id="adaptive-lax-bool"),
    pytest.param(spec("dspark", dspark_draft_topk=32), DSPARK_HF, id="topk-vocab"),
    pytest.param(spec("dspark", dspark_draft_topk=1), DSPARK_HF, id="topk-one"),
    pytest.param(spec("dspark", dspark_draft_topk=8), None, id="topk-no-hf"),
    pytest.param(spec("ngram", dspark_draft_topk=8), None, id="topk-draftless-method"),
    pytest.param(spec(None, model="pkg.MyProposer", dspark_draft_topk=8), None, id="topk-custom-class-model"),
    pytest.param(spec("draft_model", use_heterogeneous_vocab=True), None, id="hetero-vocab"),
    pytest.param(spec(None, use_heterogeneous_vocab=True, draft_sample_method="greedy"), None,
                 id="hetero-vocab-default-method"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[1, 8, 3], [9, 64, 1]]), None, id="schedule"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[(17, 64, 1), (1, 8, 3)]), None, id="schedule-gap"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[1, "8", 0]]), None, id="schedule-lax-int"),
    pytest.param(spec(some_future_field=1, draft_tensor_parallel_size=1), None, id="unknown-keys"),
]


@pytest.mark.parametrize(("config", "draft_hf"), ACCEPTED)
def test_accepted(config, draft_hf):
    check_speculative_config(config, draft_hf=draft_hf)


REFUSED = [
    pytest.param(spec(rejection_sample_method="fly"), None, "rejection_sample_method", "ValidationError",
                 "1 validation error for SpeculativeConfig: rejection_sample_method: "
                 "Input should be 'standard', 'synthetic' or 'block'", id="fly"),
    pytest.param(spec(rejection_sample_method="synthetic"), None, "rejection_sample_method", "ValueError",
                 "rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
                 "synthetic_acceptance_length.", id="synthetic-neither"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.9, 0.8, 0.7],
                      synthetic_acceptance_length=2), None, "rejection_sample_method", "ValueError",
                 "rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
                 "synthetic_acceptance_length.", id="synthetic-both"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.9, 0.8]), None,
                 "synthetic_acceptance_rates", "ValueError",
                 "synthetic_acceptance_rates must have length 3, got [0.9, 0.8].", id="synthetic-rates-length"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.9, 0.8, 1.2]), None,
                 "synthetic_acceptance_rates", "ValueError",
                 "synthetic_acceptance_rates entries must be in [0, 1], got [0.9, 0.8, 1.2].", id="synthetic-range"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=[0.7, 0.8, 0.6]), None,
                 "synthetic_acceptance_rates", "ValueError",
                 "synthetic_acceptance_rates must be non-increasing, got [0.7, 0.8, 0.6].", id="synthetic-increasing"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=4.5), None,
                 "synthetic_acceptance_length", "ValueError",
                 "synthetic_acceptance_length must be in [1, 4], got 4.5.", id="synthetic-length-high"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=0.5), None,
                 "synthetic_acceptance_length", "ValueError",
                 "synthetic_acceptance_length must be in [1, 4], got 0.5.", id="synthetic-length-low"),
    pytest.param(spec(synthetic_acceptance_length=2.5), None, "synthetic_acceptance_length", "ValueError",
                 "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                 "rejection_sample_method='synthetic'.", id="synthetic-length-without-method"),
    pytest.param(spec(rejection_sample_method="block", synthetic_acceptance_rates=[0.9, 0.8, 0.7]), None,
                 "synthetic_acceptance_rates", "ValueError",
                 "synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                 "rejection_sample_method='synthetic'.", id="synthetic-rates-without-method"),
    pytest.param(spec(rejection_sample_method="synthetic", synthetic_acceptance_rates=["a", 0.8, 0.7]), None,
                 "synthetic_acceptance_rates", "ValidationError",
                 "1 validation error for SpeculativeConfig: synthetic_acceptance_rates.0: "
                 "Input should be a valid number, unable to parse string as a number", id="synthetic-rates-type"),
    pytest.param(spec(enable_adaptive_verification=True, use_local_argmax_reduction=True), None,
                 "enable_adaptive_verification", "ValueError",
                 "Adaptive verification estimates per-position acceptance from the draft logits, which "
                 "use_local_argmax_reduction never materializes. Disable one of them.", id="adaptive-local-argmax"),
    pytest.param(spec(enable_adaptive_verification="maybe"), None, "enable_adaptive_verification",
                 "ValidationError", "1 validation error for SpeculativeConfig: enable_adaptive_verification: "
                 "Input should be a valid boolean, unable to interpret input", id="adaptive-type"),
    pytest.param(spec("dspark", dspark_draft_topk=0), None, "dspark_draft_topk", "ValidationError",
                 "1 validation error for SpeculativeConfig: dspark_draft_topk: "
                 "Input should be greater than or equal to 1", id="topk-zero"),
    pytest.param(spec("dspark", dspark_draft_topk="x"), None, "dspark_draft_topk", "ValidationError",
                 "1 validation error for SpeculativeConfig: dspark_draft_topk: "
                 "Input should be a valid integer, unable to parse string as an integer", id="topk-type"),
    pytest.param(spec("eagle3", dspark_draft_topk=8), None, "dspark_draft_topk", "ValueError",
                 "dspark_draft_topk is only supported by DSpark", id="topk-not-dspark"),
    pytest.param(spec(None, dspark_draft_topk=8), None, "dspark_draft_topk", "ValueError",
                 "dspark_draft_topk is only supported by DSpark", id="topk-default-method"),
    pytest.param(spec(None, model="org/pkg.MyProposer", dspark_draft_topk=8), None, "dspark_draft_topk", "ValueError",
                 "dspark_draft_topk is only supported by DSpark", id="topk-model-path"),
    pytest.param(spec("dspark", dspark_draft_topk=33), DSPARK_HF, "dspark_draft_topk", "ValueError",
                 "dspark_draft_topk must be between 1 and the draft vocabulary size (32)", id="topk-over-vocab"),
    pytest.param(spec("dspark"), {**DSPARK_HF, "dspark_draft_topk": 64}, "dspark_draft_topk", "ValueError",
                 "dspark_draft_topk must be between 1 and the draft vocabulary size (32)", id="topk-from-hf"),
    pytest.param(spec("dspark", dspark_draft_topk=8), {**DSPARK_HF, "architectures": ["DFlashDraftModel"]},
                 "dspark_draft_topk", "ValueError",
                 "dspark_draft_topk is only supported by Qwen3DSparkModel and Qwen3OmniDSparkModel",
                 id="topk-architecture"),
    pytest.param(spec("eagle3", use_heterogeneous_vocab=True), None, "use_heterogeneous_vocab", "ValueError",
                 "use_heterogeneous_vocab only works with method='draft_model'", id="hetero-vocab-method"),
    pytest.param(spec("draft_model", use_heterogeneous_vocab=True, draft_sample_method="probabilistic"), None,
                 "use_heterogeneous_vocab", "ValueError",
                 "use_heterogeneous_vocab currently only supports greedy draft sampling. Set "
                 "draft_sample_method='greedy' (the default) or omit it.", id="hetero-vocab-probabilistic"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[1, 8]]), None, "num_speculative_tokens_per_batch_size",
                 "ValidationError", "1 validation error for SpeculativeConfig: "
                 "num_speculative_tokens_per_batch_size.0.2: Field required", id="schedule-entry-short"),
    pytest.param(spec(num_speculative_tokens_per_batch_size="1-8:3"), None, "num_speculative_tokens_per_batch_size",
                 "ValidationError", "1 validation error for SpeculativeConfig: "
                 "num_speculative_tokens_per_batch_size: Input should be a valid list", id="schedule-not-list"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[]), None, "num_speculative_tokens_per_batch_size",
                 "ValueError", "num_speculative_tokens_per_batch_size must not be empty.", id="schedule-empty"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[0, 8, 3]]), None,
                 "num_speculative_tokens_per_batch_size", "ValueError",
                 "Batch-size range (0, 8) must be positive.", id="schedule-not-positive"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[8, 1, 3]]), None,
                 "num_speculative_tokens_per_batch_size", "ValueError",
                 "Batch-size range start must be <= end for (8, 1, 3).", id="schedule-reversed"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[1, 8, -1]]), None,
                 "num_speculative_tokens_per_batch_size", "ValueError",
                 "num_speculative_tokens_per_batch_size values must be >= 0.", id="schedule-negative-k"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[1, 8, 3], [8, 16, 2]]), None,
                 "num_speculative_tokens_per_batch_size", "ValueError",
                 "Batch-size ranges must be non-overlapping and sorted.", id="schedule-overlap"),
    pytest.param(spec(num_speculative_tokens_per_batch_size=[[2, 8, 3]]), None,
                 "num_speculative_tokens_per_batch_size", "ValueError",
                 "The first batch-size range must start at 1 so every runtime batch size has a defined schedule.",
                 id="schedule-start"),
]


@pytest.mark.parametrize(("config", "draft_hf", "field", "exc_type", "message"), REFUSED)
def test_refused(config, draft_hf, field, exc_type, message):
    with pytest.raises(VllmError) as err:
        check_speculative_config(config, draft_hf=draft_hf)
    assert (err.value.field, err.value.exc_type, err.value.message) == (field, exc_type, message)


def test_num_speculative_tokens_rule_unchanged():
    with pytest.raises(VllmError, match="Expected num_speculative_tokens to be greater than zero"):
        check_speculative_config(spec(num_speculative_tokens=0))
    check_speculative_config({"method": "eagle3", "num_speculative_tokens": 5})


def test_schedule_checker_alone():
    check_dynamic_sd_schedule([(1, 4, 5), (5, 5, 0)])
    with pytest.raises(VllmError, match="non-overlapping"):
        check_dynamic_sd_schedule([(1, 4, 5), (4, 5, 0)])


def test_lossy_reason():
    assert {"fly", "synthetic"} <= LOSSY_REJECTION_METHODS
    assert not {"standard", "block"} & LOSSY_REJECTION_METHODS
    fly = lossy_reason(spec(rejection_sample_method="fly"))
    assert fly is not None and "fly" in fly and "\n" not in fly
    synthetic = lossy_reason(spec(rejection_sample_method="synthetic", synthetic_acceptance_length=2.0))
    assert synthetic is not None and "without comparing it with the target" in synthetic and "\n" not in synthetic
    assert lossy_reason(spec(rejection_sample_method="standard")) is None
    assert lossy_reason(spec(rejection_sample_method="block")) is None
    assert lossy_reason(spec()) is None


def test_serve_checks_a_users_speculative_config_and_labels_a_lossy_one(tmp_path):
    """plan_server refuses what vLLM would refuse, naming the field, and labels a lossy rejection method."""
    import json

    from engine.errors import WorkbenchError
    from engine.serve.server import plan_server

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    assert plan_server(target=str(target), speculative_config=ngram).lossy is None
    synthetic = ngram | {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0}
    assert "not the target's" in plan_server(target=str(target), speculative_config=synthetic).lossy
    with pytest.raises(WorkbenchError, match="vLLM would refuse this speculative config: .*rejection_sample_method"):
        plan_server(target=str(target), speculative_config=ngram | {"rejection_sample_method": "fly"})


def test_serve_takes_more_speculative_fields_and_checks_them_in_either_form():
    """`serve --speculative-fields JSON`: vLLM's rules see the fields merged with the draft's own (auto form) or in
    the explicit config, before any server starts; a lossy method is labelled, a refused one names its field."""
    from pathlib import Path

    from engine.commands.serve import _plan
    from engine.errors import WorkbenchError
    from engine.serve.options import ServeOptions

    draft = str(Path(__file__).resolve().parents[2] / "assets" / "drafts" / "smollm2-135m-instruct-eagle3")
    synthetic = '{"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0}'
    for form in ("auto", "explicit"):
        plan = _plan(ServeOptions(draft=draft, form=form, speculative_fields=synthetic))
        assert "not the target's" in plan.lossy and '"rejection_sample_method": "synthetic"' in plan.vllm_serve_line()
        assert _plan(ServeOptions(draft=draft, form=form, speculative_fields='{"rejection_sample_method": "block"}'
                                  )).lossy is None
        with pytest.raises(WorkbenchError, match="vLLM would refuse .*synthetic_acceptance"):
            _plan(ServeOptions(draft=draft, form=form, speculative_fields='{"synthetic_acceptance_length": 2.0}'))
    with pytest.raises(ValueError, match="must be a JSON object"):
        ServeOptions(draft=draft, speculative_fields="[1, 2]")
    with pytest.raises(ValueError, match="is not JSON"):
        ServeOptions(draft=draft, speculative_fields="{rejection_sample_method: block}")
    with pytest.raises(WorkbenchError, match="needs a draft"):
        _plan(ServeOptions(no_draft=True, target="smollm2-135m-instruct", speculative_fields=synthetic))


def test_the_serve_job_gets_every_option_given_and_per_request_metrics_reach_vllm(capsys):
    """A serve job (the default) reruns `serve --foreground` with the same options: the speculative fields and
    `--per-request-spec-decode-metrics` too (the fields were dropped before); the metrics flag reaches vLLM's
    command line, and without a draft it is refused."""
    from pathlib import Path

    from engine.cli import build_parser
    from engine.commands.flags import options_from_args
    from engine.commands.serve import _job_argv, _plan, _print_plan
    from engine.errors import WorkbenchError
    from engine.serve.options import ServeOptions

    draft = str(Path(__file__).resolve().parents[2] / "assets" / "drafts" / "smollm2-135m-instruct-eagle3")
    given = ServeOptions(draft=draft, speculative_fields='{"rejection_sample_method": "block"}',
                         per_request_spec_decode_metrics="detailed", k=2)
    again = options_from_args(build_parser().parse_args(_job_argv(given, 8123)), ServeOptions)
    assert again.speculative_config() == {"rejection_sample_method": "block"}
    assert again.per_request_spec_decode_metrics == "detailed" and again.k == 2 and again.port == 8123
    assert again.vllm_flags() == ["--per-request-spec-decode-metrics", "detailed"]
    _print_plan(_plan(again), again.vllm_flags())
    assert capsys.readouterr().out.split("\n")[0].endswith("--per-request-spec-decode-metrics detailed")
    assert ServeOptions(draft=draft).vllm_flags() == []
    with pytest.raises(WorkbenchError, match="--no-draft serves none"):
        _plan(ServeOptions(no_draft=True, target="smollm2-135m-instruct", per_request_spec_decode_metrics="summary"))
