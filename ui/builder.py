"""The Config builder's model: one speculators config dict edited by a visual form and a JSON editor in sync.

The dict in `builder_cfg` is the truth. A form edit writes one field into it and re-serialises the JSON text;
a JSON edit replaces it and drops the form's widget values so that they are re-read from the dict.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

import streamlit as st

from engine.algos import algorithm_names
from engine.data.extract.layer_ids import default_layer_ids
from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import read_config_dict
from engine.format.config import (
    CONFIG_TYPES,
    DraftConfig,
    ProposalMethod,
    VerifierInfo,
    build_draft_config,
    config_types,
)
from engine.serve.options import ServeOptions
from ui.forms import FieldKind, field_kind, from_widget, to_widget, validation_errors

CFG, TEXT, JSON_ERROR, PREFIX = "builder_cfg", "builder_json", "builder_json_error", "builder_f_"
MISSING = object()


@dataclass(frozen=True)
class BuilderField:
    path: str
    kind: FieldKind
    help: str | None


_TLC = [
    ("model_type", Literal["llama", "qwen3"], "Draft decoder family: vLLM builds Llama or Qwen3 layers."),
    ("hidden_size", int, "Draft hidden size (usually the verifier's)."),
    ("intermediate_size", int, "MLP width of the draft layers."),
    ("num_hidden_layers", int, "Draft decoder layers."),
    ("num_attention_heads", int, "Attention heads."),
    ("num_key_value_heads", int, "Key/value heads (GQA)."),
    ("head_dim", int, "Dimension per head."),
    ("vocab_size", int, "The verifier's vocabulary size (drafts index it)."),
    ("max_position_embeddings", int, "Longest position the draft supports."),
    ("rms_norm_eps", float, "RMSNorm epsilon."),
    ("sliding_window", int | None, "Sliding window of sliding-attention layers."),
    ("layer_types", list[str] | None, "One of sliding_attention / full_attention per layer."),
    ("num_aux_hidden_states", int | None, "vLLM's Llama chain-draft class reads the aux-layer count here (default 3)."),
]
# layer-config keys that only some types read (each config class lists its own)
_TYPE_SPECIFIC = {k for t in config_types() for k in CONFIG_TYPES.get(t).own_layer_config_keys}


def fields_for(algorithm: str | None) -> dict[str, list[BuilderField]]:
    """The form's fields, grouped; descriptions from the pydantic models (and short notes for layer keys)."""
    cls = CONFIG_TYPES.get(algorithm) if algorithm in CONFIG_TYPES else None
    algo_kind = FieldKind("choice", False, tuple(config_types()))  # every type it validates (uploads too)
    pm, vi = ProposalMethod.model_fields, VerifierInfo.model_fields
    groups: dict[str, list[BuilderField]] = {
        "Algorithm and proposal": [
            BuilderField("speculators_model_type", algo_kind,
                         DraftConfig.model_fields["speculators_model_type"].description),
            BuilderField("speculators_config.proposal_methods[0].speculative_tokens",
                         field_kind(pm["speculative_tokens"].annotation), pm["speculative_tokens"].description),
            BuilderField("speculators_config.verifier.name_or_path", field_kind(vi["name_or_path"].annotation),
                         vi["name_or_path"].description),
            BuilderField("speculators_config.verifier.architectures", field_kind(vi["architectures"].annotation),
                         vi["architectures"].description),
        ],
        "Vocabulary and sizes": [
            BuilderField(n, field_kind(DraftConfig.model_fields[n].annotation), DraftConfig.model_fields[n].description)
            for n in ("draft_vocab_size", "target_hidden_size")
        ],
    }
    if cls is not None:
        own = [n for n in cls.model_fields if n not in DraftConfig.model_fields]
        groups[f"{algorithm} fields"] = [BuilderField(n, field_kind(cls.model_fields[n].annotation),
                                                      cls.model_fields[n].description) for n in own]
    groups["transformer_layer_config (the draft decoder)"] = [
        BuilderField(f"transformer_layer_config.{n}", field_kind(t), h) for n, t, h in _TLC
        if n not in _TYPE_SPECIFIC or (cls is not None and n in cls.own_layer_config_keys)]
    return groups


# -- paths ----------------------------------------------------------------------------------------

_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parts(path: str) -> list[str | int]:
    return [int(i) if i else name for name, i in _PART.findall(path)]


def get_path(cfg: Any, path: str) -> Any:
    node = cfg
    for part in _parts(path):
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return node


def set_path(cfg: dict, path: str, value: Any) -> None:
    parts = _parts(path)
    node: Any = cfg
    for part, nxt in pairwise(parts):
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(part, int):
            while len(node) <= part:
                node.append(copy.deepcopy(empty))
            if not isinstance(node[part], (dict, list)):
                node[part] = empty
        elif not isinstance(node.get(part), (dict, list)):
            node[part] = empty
        node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        while len(node) <= last:
            node.append(None)
    node[last] = value


def widget_key(path: str) -> str:
    return PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", path)


def fits(kind: FieldKind, value: Any) -> bool:
    """Whether the typed widget can show this value (otherwise a raw JSON text box is used)."""
    if value is MISSING or value is None:
        return kind.kind != "bool"
    if kind.kind == "bool":
        return isinstance(value, bool)
    if kind.kind == "choice":
        return value in kind.choices
    if kind.kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind.kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind.kind == "str":
        return isinstance(value, str)
    if kind.kind == "list":
        return isinstance(value, list) and all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in value)
    return True


# -- state transitions (widget callbacks) ----------------------------------------------------------


def _drop_form_keys() -> None:
    for key in [k for k in st.session_state if str(k).startswith(PREFIX)]:
        del st.session_state[key]


TRAINED_K = "builder_trained_k"  # k of the config as loaded from a draft (what it was written and trained for)
MASK_HINT = "builder_mask_hint"


def speculative_tokens(cfg: dict[str, Any]) -> int | None:
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def k_hint(cfg: dict[str, Any]) -> str | None:
    """A hint when k is above the k of the draft as it was loaded (the training default: positions past it are
    untrained, so they are rarely accepted)."""
    trained, k = st.session_state.get(TRAINED_K), speculative_tokens(cfg)
    if trained and k and k > trained:
        return (f"k = {k} is more than the {trained} draft positions this draft was written with (its training "
                "default): positions past it were not trained and are rarely accepted. Measure it on Benchmarks "
                "or with `python -m engine evaluate --k 1-8` before serving it.")
    return None


def load(cfg: dict[str, Any], *, from_draft: bool = False) -> None:
    """Replace the edited config (both views); `from_draft` remembers its k (for `k_hint`)."""
    st.session_state[TRAINED_K] = speculative_tokens(cfg) if from_draft else None
    if not from_draft:
        st.session_state.pop(MASK_HINT, None)
    st.session_state[CFG] = copy.deepcopy(cfg)
    st.session_state[TEXT] = dump(cfg)
    st.session_state.pop(JSON_ERROR, None)
    _drop_form_keys()


def dump(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, indent=2, sort_keys=True)


def on_json_edit() -> None:
    text = st.session_state.get(TEXT, "")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        st.session_state[JSON_ERROR] = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
        return
    if not isinstance(data, dict):
        st.session_state[JSON_ERROR] = "the config must be a JSON object ({...})"
        return
    st.session_state.pop(JSON_ERROR, None)
    st.session_state[CFG] = data
    _drop_form_keys()


def on_form_edit(path: str, kind: FieldKind, raw: bool) -> None:
    value = st.session_state.get(widget_key(path) + ("_raw" if raw else ""))
    if raw:
        text = str(value or "").strip()
        try:
            parsed = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = text
    else:
        parsed = from_widget(kind, value)
    cfg = st.session_state[CFG]
    set_path(cfg, path, parsed)
    st.session_state[TEXT] = dump(cfg)
    st.session_state.pop(JSON_ERROR, None)


def field_label(path: str) -> str:
    """A form label that wraps between words: the field's name in words, with its parent object when that is not
    the form section's own (`verifier · name or path`); the exact JSON path is in the help."""
    parts = [re.sub(r"\[\d+\]$", "", p) for p in path.split(".")
             if p not in ("speculators_config", "transformer_layer_config")]
    words = [p.replace("_", " ") for p in parts if p != "proposal_methods"]
    return " · ".join(words)


def widget(field: BuilderField, issues: list) -> None:
    """The widget for one path of the config, with its validation findings under it."""
    cfg = st.session_state[CFG]
    value = get_path(cfg, field.path)
    raw = not fits(field.kind, value)
    key = widget_key(field.path) + ("_raw" if raw else "")
    if key not in st.session_state:
        if raw:
            st.session_state[key] = "" if value is MISSING else json.dumps(value)
        else:
            shown = to_widget(field.kind, None if value is MISSING else value)
            # a float32 value a draft was saved with (9.999999747378752e-06) is shown as written (1e-05)
            st.session_state[key] = tidy_floats(shown) if field.kind.kind == "float" else shown
    label = field_label(field.path)
    help_text = (field.help or "") + f"\n\nJSON path: `{field.path}`" + ("" if value is not MISSING else " (not set)")
    common = dict(key=key, help=help_text, on_change=on_form_edit, args=(field.path, field.kind, raw))
    kind = field.kind.kind
    if raw:
        st.text_input(label + " (raw JSON)", **common)
    elif kind == "bool":
        st.checkbox(label, **common)
    elif kind == "choice":
        options = list(field.kind.choices)
        if st.session_state[key] not in options:
            st.session_state[key] = options[0]
        st.selectbox(label, options, **common)
    elif kind in ("int", "float"):
        st.number_input(label, step=1 if kind == "int" else None, format=None if kind == "int" else "%g",
                        placeholder="not set", **common)
    else:
        st.text_input(label, placeholder="comma-separated" if kind == "list" else "not set", **common)
    for issue in issues:
        tag = "vLLM" if issue.layer == "vllm" else "workbench"
        colour = "red" if issue.severity == "error" else "orange"
        st.caption(f":{colour}[**{tag}:** {issue.message}]" + (f"  \n:gray[vLLM says: {issue.vllm_message}]"
                                                             if issue.vllm_message else ""))


def template(algorithm: str, target_path: str, verifier_name: str | None) -> dict[str, Any]:
    """A fresh config of `algorithm` for a target folder (the shapes and names the target implies)."""
    verifier = read_config_dict(target_path)
    text = verifier.get("text_config", verifier) if "num_hidden_layers" not in verifier else verifier
    cls = CONFIG_TYPES.get(algorithm)
    fields: dict[str, Any] = {"draft_vocab_size": text.get("vocab_size"),
                              cls.aux_field: default_layer_ids(int(text["num_hidden_layers"]), algorithm)}
    if cls.uses_mask_token:
        fields["mask_token_id"] = suggest_mask_token(target_path)[0]
    cfg = build_draft_config(algorithm, verifier_config=text, verifier_name=verifier_name, **fields)
    cfg.speculators_config.verifier.architectures = list(verifier.get("architectures") or [])
    return tidy_floats(cfg.to_dict())


def suggest_mask_token(target_path: str) -> tuple[int | None, str]:
    """A token id for the parallel slots of configs whose class `uses_mask_token`: the tokenizer's mask token,
    else its pad token when it differs from EOS; (None, why) when the tokenizer has neither."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(target_path)
    except (OSError, ValueError) as exc:
        return None, f"the target's tokenizer could not be read ({exc})"
    if tok.mask_token_id is not None:
        return int(tok.mask_token_id), f"the tokenizer's mask token `{tok.mask_token}` (id {tok.mask_token_id})"
    if tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id:
        return int(tok.pad_token_id), (f"the tokenizer's pad token `{tok.pad_token}` (id {tok.pad_token_id}): it has "
                                       "no mask token; any id the target never emits works")
    return None, ("this tokenizer has no mask or separate pad token: set `mask_token_id` to a token id the target "
                  "never emits (e.g. an unused special token), the same one the draft is trained with")


def tidy_floats(obj: Any) -> Any:
    """Floats that are float32 values printed in float64 (9.999999747378752e-06) as they were written (1e-05)."""
    import struct

    if isinstance(obj, dict):
        return {k: tidy_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [tidy_floats(v) for v in obj]
    if isinstance(obj, float) and obj == obj and obj not in (float("inf"), float("-inf")):
        as32 = struct.unpack("f", struct.pack("f", obj))[0]
        if as32 == obj:
            for digits in range(1, 10):
                short = float(f"{obj:.{digits}g}")
                if struct.unpack("f", struct.pack("f", short))[0] == as32:
                    return short
    return obj


def algorithms() -> list[str]:
    """The algorithms a new config starts from: the registry's list, as on every page."""
    return algorithm_names()


def parse_upload(name: str, data: bytes) -> dict[str, Any]:
    """An uploaded config.json as a dict, or a clear error."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"{name} is not valid JSON ({exc})", hint="upload a config.json") from None
    if not isinstance(parsed, dict):
        raise WorkbenchError(f"{name} holds a JSON {type(parsed).__name__}, not an object", hint="upload a config.json")
    return parsed


def speculative_fields(text: str, spec: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """The user's extra speculative_config fields (JSON text) checked with the derived `spec` by vLLM's rules:
    (fields or None, why vLLM would refuse them or None, why they make decoding lossy or None)."""
    if not text.strip():
        return None, None, None
    options, errors = validation_errors(ServeOptions, {"speculative_fields": text})
    if options is None:
        return None, "; ".join(m for found in errors.values() for m in found), None
    fields = options.speculative_config()
    refused, lossy = vr.speculative_config_verdict({**spec, **fields})
    if refused:
        return fields, f"vLLM would refuse it: {refused.vllm_message} (field '{refused.field}')", None
    return fields, None, lossy


def to_json_bytes(cfg: dict[str, Any]) -> bytes:
    return (dump(cfg) + "\n").encode()


__all__ = ["CFG", "JSON_ERROR", "TEXT", "algorithms", "fields_for", "get_path", "load", "on_json_edit", "parse_upload",
           "set_path", "template", "to_json_bytes", "widget", "widget_key"]
