"""Layouts recognised but not convertible into a draft vLLM 0.33 loads: EAGLE-1/2, HASS, Medusa, native MTP heads,
ModelOpt parallel-draft heads and speculators' own types vLLM 0.33 does not register (eagle, mtp, xpress, ...)."""

from __future__ import annotations

from typing import Any

import engine.algos  # noqa: F401  (registers the speculators types the rules below name)
from engine.convert.base import not_convertible
from engine.format import vllm_rules as vr

_SERVED = ", ".join(vr.served_types())
_RETRAIN = "train a draft of a type it serves with the workbench (python -m engine train --algo ...)"


def _shape(index, name: str) -> tuple[int, ...] | None:
    info = index.get(name)
    return tuple(info.shape) if info is not None else None


def _eagle12_layout(index) -> bool:
    """EAGLE-1/2 (SafeAILab's cnets): `fc` [H, 2H] fuses (embedding, feature); a plain decoder `layers.0.*` reads H."""
    fc, q = _shape(index, "fc.weight"), _shape(index, "layers.0.self_attn.q_proj.weight")
    return fc is not None and q is not None and len(fc) == 2 and fc[1] == 2 * fc[0] and q[1] == fc[0] \
        and not any(n.startswith("midlayer.") for n in index)


@not_convertible("hass", "HASS draft (EAGLE-2 layout with a hidden_layernorm)",
                 why="HASS trains the EAGLE-2 architecture (fc over [embedding; feature], no aux layers of the "
                 f"verifier); {vr.RULES_LABEL} registers no speculators type for it (only " + _SERVED + ")",
                 instead="serve it with SafeAILab/EAGLE or SGLang's EAGLE (EAGLE-2) support, or " + _RETRAIN)
def _hass(config: dict[str, Any], index) -> bool:
    return _eagle12_layout(index) and any("hidden_layernorm" in n for n in index)


@not_convertible("eagle1-2", "EAGLE-1 / EAGLE-2 draft (SafeAILab cnets: fc [H, 2H], layers.0.*)",
                 why=f"EAGLE-1/2 predict the next feature from the verifier's last hidden state only; {vr.RULES_LABEL} "
                 "serves EAGLE-3-style drafts (fused aux layers) and has no speculators type for these",
                 instead="serve it with vLLM's `--speculative-config '{\"method\": \"eagle\", ...}'` outside the "
                 "speculators format, or " + _RETRAIN)
def _eagle12(config: dict[str, Any], index) -> bool:
    return _eagle12_layout(index)


@not_convertible("medusa", "Medusa heads (medusa_head.*)",
                 why="Medusa heads are residual blocks on the verifier's last hidden state, drafting positions "
                 f"independently; neither speculators 0.9.0 nor {vr.RULES_LABEL} has a Medusa type",
                 instead="serve with a framework that runs Medusa heads (e.g. TensorRT-LLM), or " + _RETRAIN)
def _medusa(config: dict[str, Any], index) -> bool:
    return "medusa_num_heads" in config or any(n.startswith(("medusa_head.", "medusa_heads.")) for n in index)


@not_convertible("mtp-native", "native MTP heads of the model itself (mtp.* / nextn layers)",
                 why=f"multi-token-prediction heads are part of the verifier's own checkpoint; {vr.RULES_LABEL} serves "
                 "them natively, and a speculators `mtp` draft is not a type it loads",
                 instead="serve them natively: vllm serve <model> --speculative-config "
                 "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'")
def _mtp(config: dict[str, Any], index) -> bool:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads = any(text.get(k) for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"))
    return heads or any(n.startswith(("mtp.", "model.mtp.")) or ".eh_proj." in n for n in index)


@not_convertible("modelopt-parallel-draft", "NVIDIA ModelOpt export with parallel draft heads",
                 why="ModelOpt's parallel_draft_heads.* are extra Medusa-style heads beside the EAGLE layer; "
                 f"{vr.RULES_LABEL} has no speculators type that loads them",
                 instead="re-export from ModelOpt with parallel_draft_step 1 (a plain EAGLE-3 export converts)")
def _modelopt_parallel(config: dict[str, Any], index) -> bool:
    step = (config.get("eagle_config") or {}).get("parallel_draft_step") if isinstance(
        config.get("eagle_config"), dict) else None
    return bool(step and int(step) > 1) or any(n.startswith("parallel_draft_heads.") for n in index)


@not_convertible("modelopt-no-aux", "NVIDIA ModelOpt EAGLE export without aux hidden states",
                 why="eagle_config.use_aux_hidden_state is false: an EAGLE-1/2-style head on the last hidden state, "
                 f"which no speculators type {vr.RULES_LABEL} loads describes",
                 instead="re-train with use_aux_hidden_state (EAGLE-3) in ModelOpt, or " + _RETRAIN)
def _modelopt_no_aux(config: dict[str, Any], index) -> bool:
    eagle = config.get("eagle_config")
    return isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False


_SPECULATORS_WHY = {
    "eagle": ("speculators' historical EAGLE-1/2/HASS type (removed after speculators 0.3)",
              f"re-train as an EAGLE-3 draft; {vr.RULES_LABEL} does not register `eagle` as a speculators type"),
    "mtp": ("a speculators MTP draft (the verifier's own MTP layer, extracted)",
            ("serve the verifier's native MTP heads: vllm serve <model> --speculative-config "
            "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'")),
    "xpress": ("a speculators XPress draft (speculators 0.9.0, experimental)",
               f"use a vLLM build that registers xpress, or train a DFlash draft, which {vr.RULES_LABEL} serves"),
}


def _speculators_explained(config: dict[str, Any]) -> tuple[str, str, str]:
    kind = config.get("speculators_model_type")
    what, instead = _SPECULATORS_WHY.get(kind, (f"a speculators `{kind}` draft", _RETRAIN))
    return (f"speculators `{kind}` draft: {what}",
            f"{vr.RULES_LABEL} registers only these speculators types: {_SERVED}", instead)


@not_convertible("speculators-unsupported", f"speculators draft of a type {vr.RULES_LABEL} does not load",
                 why=f"{vr.RULES_LABEL} registers only these speculators types: " + _SERVED, instead=_RETRAIN,
                 explain=_speculators_explained)
def _speculators_other(config: dict[str, Any], index) -> bool:
    kind = config.get("speculators_model_type")
    return isinstance(kind, str) and kind not in vr.served_types()
