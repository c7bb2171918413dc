"""What vLLM 0.33 does with a speculators config and checkpoint, rule for rule, with vLLM's own messages.

Each function mirrors one piece of vLLM (file names in the docstrings) and raises `VllmError`
carrying the exception type and message vLLM would raise. Nothing here imports vLLM.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

SUPPORTED_SPECULATORS_TYPES = ("eagle3", "peagle", "dflash", "dflash2", "dspark")  # algos.py registration order
_UPDATER_NAMES = {t: f"update_{t}" for t in SUPPORTED_SPECULATORS_TYPES}


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
    if method == "peagle":
        out["method"] = "eagle3"
        out["parallel_drafting"] = True
    elif method == "dflash2":
        out["method"] = "dflash"
    return out


def extract_vllm_speculative_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    validate_speculators_config(config_dict)
    return build_vllm_speculative_config(config_dict)


def extract_transformers_pre_trained_config(config_dict: dict[str, Any]) -> dict[str, Any]:
    """`extract_transformers_pre_trained_config` (base.py l.46-63): the draft hf_config vLLM builds.

    Works on a deep copy (vLLM mutates `transformer_layer_config` in place).
    """
    config_dict = copy.deepcopy(config_dict)
    kind = config_dict.get("speculators_model_type")
    if kind not in SUPPORTED_SPECULATORS_TYPES:
        registry = "{" + ", ".join(f"'{t}': <function {_UPDATER_NAMES[t]}>" for t in SUPPORTED_SPECULATORS_TYPES) + "}"
        raise VllmError("ValueError", f"Expected one of: {registry}. Please ensure you're loading a "
                        "speculators-format model.", field="speculators_model_type")
    pre = config_dict.get("transformer_layer_config", {})
    _UPDATERS[kind](config_dict, pre)
    return pre


# -- speculators/algos.py ------------------------------------------------------------------------


def _update_eagle3(cfg: dict, pre: dict) -> None:
    pre["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        pre["target_hidden_size"] = cfg["target_hidden_size"]
    pre["norm_before_residual"] = cfg.get("norm_before_residual", True)
    pre["norm_before_fc"] = cfg.get("norm_before_fc", False)
    pre["fc_norm"] = cfg.get("fc_norm", False)
    pre["norm_output"] = cfg.get("norm_output", False)
    model_type = pre.get("model_type", "llama")
    archs = {"qwen3": "Eagle3Qwen3ForCausalLM", "llama": "Eagle3LlamaForCausalLM"}
    if model_type not in archs:
        raise VllmError("ValueError", f"Unsupported model_type {model_type} for Eagle3 speculator",
                        field="transformer_layer_config.model_type")
    pre["architectures"] = [archs[model_type]]
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        pre["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]


def _update_peagle(cfg: dict, pre: dict) -> None:
    pre["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        pre["target_hidden_size"] = cfg["target_hidden_size"]
    pre["norm_before_residual"] = cfg.get("norm_before_residual", False)
    pre["norm_before_fc"] = cfg.get("norm_before_fc", False)
    model_type = pre.get("model_type", "llama")
    archs = {"qwen3": "PeagleQwen3ForCausalLM", "llama": "PeagleLlamaForCausalLM"}
    if model_type not in archs:
        raise VllmError("ValueError", f"Unsupported model_type {model_type} for PEagle speculator",
                        field="transformer_layer_config.model_type")
    pre["architectures"] = [archs[model_type]]
    if "mask_token_id" not in cfg:
        raise VllmError("KeyError", "'mask_token_id'", field="mask_token_id")
    pre["pard_token"] = cfg["mask_token_id"]
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        pre["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]


def _update_dflash(cfg: dict, pre: dict) -> None:
    pre["architectures"] = ["DFlashDraftModel"]
    pre["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        pre["target_hidden_size"] = cfg["target_hidden_size"]
    if "aux_hidden_state_layer_ids" not in cfg:
        raise VllmError("KeyError", "'aux_hidden_state_layer_ids'", field="aux_hidden_state_layer_ids")
    aux = cfg["aux_hidden_state_layer_ids"]
    pre["eagle_aux_hidden_state_layer_ids"] = aux
    if "mask_token_id" not in cfg:
        raise VllmError("KeyError", "'mask_token_id'", field="mask_token_id")
    try:
        target_layer_ids = [i - 1 for i in aux]
    except TypeError as exc:
        raise VllmError("TypeError", str(exc), field="aux_hidden_state_layer_ids") from None
    pre["dflash_config"] = {
        "mask_token_id": cfg["mask_token_id"],
        "target_layer_ids": target_layer_ids,
        "sample_from_anchor": cfg.get("sample_from_anchor", False),
        "causal": not cfg.get("sliding_window_non_causal", True),
    }


def _update_dflash2(cfg: dict, pre: dict) -> None:
    _update_dflash(cfg, pre)
    pre["architectures"] = ["DFlash2DraftModel"]
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        if cfg.get(key) is not None:
            pre["dflash_config"][key] = cfg[key]


def _update_dspark(cfg: dict, pre: dict) -> None:
    allowed = {"Qwen3DSparkModel", "Qwen3OmniDSparkModel"}
    archs = [a for a in (cfg.get("architectures") or []) if a in allowed]
    pre["architectures"] = archs or ["Qwen3DSparkModel"]
    sample_from_anchor = cfg.get("sample_from_anchor", False)
    pre["sample_from_anchor"] = sample_from_anchor
    pre["dspark_bonus_anchor"] = not sample_from_anchor
    if "aux_hidden_state_layer_ids" not in cfg:
        raise VllmError("KeyError", "'aux_hidden_state_layer_ids'", field="aux_hidden_state_layer_ids")
    aux = cfg["aux_hidden_state_layer_ids"]
    pre["eagle_aux_hidden_state_layer_ids"] = aux
    try:
        pre["target_layer_ids"] = [i - 1 for i in aux]
    except TypeError as exc:
        raise VllmError("TypeError", str(exc), field="aux_hidden_state_layer_ids") from None
    for key in ("draft_vocab_size", "target_hidden_size", "mask_token_id", "markov_rank", "markov_head_type",
                "block_size", "enable_confidence_head", "confidence_head_with_markov", "use_aux_hidden_state"):
        if cfg.get(key) is not None:
            pre[key] = cfg[key]


_UPDATERS = {
    "eagle3": _update_eagle3, "peagle": _update_peagle, "dflash": _update_dflash,
    "dflash2": _update_dflash2, "dspark": _update_dspark,
}


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


def check_speculative_config(spec: dict[str, Any]) -> None:
    """`SpeculativeConfig` checks that apply to a derived config (config/speculative.py)."""
    num = spec.get("num_speculative_tokens")
    if num is None and spec.get("method") != "dspark":
        raise VllmError("ValueError", "A speculative model was provided, but `num_speculative_tokens` was not provided",
                        field="speculators_config.proposal_methods[0].speculative_tokens")
    if num is not None and (not isinstance(num, int) or num <= 0):
        raise VllmError("ValueError", f"Expected num_speculative_tokens to be greater than zero ({num}).",
                        field="speculators_config.proposal_methods[0].speculative_tokens")


# -- model_executor/models/*: the parameters each draft class creates ----------------------------


def _attn_mlp(prefix: str, h: int, in_dim: int, nh: int, nkv: int, hd: int, inter: int, *, qk_norm: bool,
              bias: bool) -> dict[str, tuple[int, ...]]:
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
    if bias:
        out[f"{prefix}self_attn.q_proj.bias"] = (nh * hd,)
        out[f"{prefix}self_attn.k_proj.bias"] = (nkv * hd,)
        out[f"{prefix}self_attn.v_proj.bias"] = (nkv * hd,)
        out[f"{prefix}self_attn.o_proj.bias"] = (h,)
    return out


def eagle3_num_aux(hf: dict[str, Any]) -> int:
    """How many aux states vLLM's EAGLE-3 class assumes (llama_eagle3.py l.209-221, qwen3_eagle3.py l.201-214)."""
    eagle_cfg = hf.get("eagle_config") or {}
    if "Eagle3Qwen3ForCausalLM" in hf.get("architectures", []) or "PeagleQwen3ForCausalLM" in hf.get("architectures", []):
        for key in ("num_aux_layers", "num_aux_hidden_states"):
            if hf.get(key):
                return int(hf[key])
        ids = hf.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
        return len(ids) if ids else 3
    if hf.get("num_aux_hidden_states"):
        return int(hf["num_aux_hidden_states"])
    ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")  # top-level ids are NOT consulted by the Llama class
    return len(ids) if ids else 3


def expected_parameters(config_dict: dict[str, Any], hf: dict[str, Any]) -> tuple[dict[str, tuple], set[str]]:
    """Checkpoint tensor name -> shape that vLLM's draft class accepts, and which of them are optional.

    Names are as stored in a speculators checkpoint (before vLLM's `model.` prefix and q/k/v fusion).
    """
    kind = config_dict["speculators_model_type"]
    h = int(hf["hidden_size"])
    nh = int(hf["num_attention_heads"])
    nkv = int(hf.get("num_key_value_heads") or nh)
    hd = int(hf.get("head_dim") or h // nh)
    inter = int(hf["intermediate_size"])
    vocab = int(hf["vocab_size"])
    dvocab = int(hf.get("draft_vocab_size") or vocab)
    ht = int(hf.get("target_hidden_size") or h)
    layers = int(hf.get("num_hidden_layers", 1))
    bias = bool(hf.get("attention_bias", False))
    qwen = hf.get("model_type") == "qwen3"
    exp: dict[str, tuple] = {}
    optional = {"lm_head.weight", "embed_tokens.weight"}

    if kind in ("eagle3", "peagle"):
        a = eagle3_num_aux(hf)
        exp["fc.weight"] = (h, ht * a)
        for i in range(layers):
            exp.update(_attn_mlp(f"layers.{i}.", h, 2 * h if i == 0 else h, nh, nkv, hd, inter, qk_norm=qwen, bias=bias))
        exp["layers.0.hidden_norm.weight"] = (h,)
        exp["norm.weight"] = (h,)
        if hf.get("norm_before_fc"):
            exp["input_norm.weight"] = (ht * a,)
        if hf.get("fc_norm"):
            exp.update({f"fc_norm.{k}.weight": (ht,) for k in range(a)})
        if kind == "peagle":
            exp["mask_hidden"] = (1, 1, ht * a)
    else:  # dflash family and dspark
        ids = hf.get("eagle_aux_hidden_state_layer_ids") or []
        a = len(ids) if ids else layers
        exp["fc.weight"] = (h, ht * a)
        exp["hidden_norm.weight"] = (h,)
        exp["norm.weight"] = (h,)
        for i in range(layers):
            exp.update(_attn_mlp(f"layers.{i}.", h, h, nh, nkv, hd, inter, qk_norm=True, bias=bias))
        if kind == "dflash2":
            dc = hf.get("dflash_config", {})
            k, g, r = dc.get("conv_kernel_size", 2), dc.get("conv_group_size", 16), dc.get("selector_rank", 256)
            for i in range(layers):
                for conv in ("attention_conv", "mlp_conv"):
                    exp[f"layers.{i}.{conv}.base_kernel"] = (2, k, h)
                    exp[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * k * (h // max(g, 1)), h)
            exp["candidate_selector.predecessor_codebook"] = (vocab, r)
            exp["candidate_selector.successor_codebook"] = (vocab, r)
            exp["candidate_selector.hidden_projection.weight"] = (r, h)
        if kind == "dspark":
            r = int(hf.get("markov_rank") or 0)
            if r:
                exp["markov_head.markov_w1.weight"] = (vocab, r)
                exp["markov_head.markov_w2.weight"] = (dvocab, r)
            if hf.get("enable_confidence_head", False):
                width = h + (r if hf.get("confidence_head_with_markov") and r else 0)
                exp["confidence_head.proj.weight"] = (1, width)
                exp["confidence_head.proj.bias"] = (1,)
                optional |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    exp["lm_head.weight"] = (dvocab, h)
    exp["embed_tokens.weight"] = (vocab, h)
    if dvocab != vocab:
        exp["d2t"] = (dvocab,)
    return exp, optional


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
    kind = config_dict["speculators_model_type"]
    for name, shape in shapes.items():
        canon = canonical_name(name)
        if canon is None:
            continue
        if canon == "mask_hidden" and kind in ("dflash", "dflash2", "dspark"):
            errors.append(VllmError("AssertionError", "DFlash embeds masked slots via mask_token_id; mask_hidden "
                                    "must not be in the checkpoint", field=f"tensor:{name}"))
            continue
        if canon == "mask_hidden" and kind == "eagle3":
            continue  # skipped with a warning when not parallel drafting
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
    if kind == "peagle" and not any(canonical_name(n) == "mask_hidden" for n in shapes):
        errors.append(VllmError("ValueError", "mask_hidden not found in weights but model is configured for parallel "
                                "drafting. Please provide mask_hidden in the weights.", field="tensor:mask_hidden"))
    return errors


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
