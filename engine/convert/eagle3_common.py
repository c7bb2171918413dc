"""What every EAGLE-3 source shares: the key-mapping rows of the published `midlayer.*` layout and the speculators
`eagle3` config built from a research config (the sources differ in what their config records)."""

from __future__ import annotations

from typing import Any

import engine.algos  # noqa: F401  (registers the config types the converters write)
from engine.convert.base import Converter, ConvertOptions, KeyRule
from engine.errors import WorkbenchError
from engine.format.config import build_draft_config, build_layer_config, config_type

# The single-layer layout SafeAILab's `Model` and SpecForge's `LlamaForCausalLMEagle3` save: `midlayer` is the
# first decoder layer (q/k/v read [embedding; hidden], 2H), then the final norm and the draft-vocabulary head.
MIDLAYER_RULES = (
    KeyRule(r"midlayer\.(.+)", r"layers.0.\1", "the first decoder layer"),
    KeyRule(r"layers\.(\d+)\.(.+)", r"layers.\1.\2", "a later decoder layer (vLLM's numbering)"),
    KeyRule(r"fc\.weight", r"fc.weight", "fuses the verifier's aux states [H, A*Ht]"),
    KeyRule(r"norm\.weight", r"norm.weight"),
    KeyRule(r"lm_head\.weight", r"lm_head.weight", "draft-vocabulary head"),
    KeyRule(r"embed_tokens\.weight", r"embed_tokens.weight", "a copy of the verifier's embedding"),
    KeyRule(r"d2t", "d2t", "draft id -> target id offsets"),
    KeyRule(r"t2d", "t2d", "target tokens in the draft vocabulary"),
)

_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling",
               "rope_parameters")


def _rope(layer: dict[str, Any]) -> None:
    """transformers >= 5 stores RoPE as `rope_parameters`; research configs have rope_theta/rope_scaling."""
    if "rope_parameters" not in layer and "rope_theta" in layer:
        params = dict(layer.pop("rope_scaling", None) or {})
        params.setdefault("rope_type", params.pop("type", "default"))
        params["rope_theta"] = layer.pop("rope_theta")
        layer["rope_parameters"] = params
    layer.pop("rope_theta", None)
    layer.pop("rope_scaling", None)


class Eagle3Source(Converter):
    """An EAGLE-3 research layout. Subclasses say how they are recognised and what their config records; P-EAGLE
    sources reuse it with their own algorithm fields."""

    algorithm = "eagle3"
    key_map = MIDLAYER_RULES
    options = ("aux_layer_ids", "norm_before_residual", "speculative_tokens")
    draft_arch = "llama"  # the decoder-layer family (qwen3 adds q_norm/k_norm)

    def recorded_aux_ids(self, config: dict[str, Any]) -> list[int] | None:
        """The verifier layer ids the source's config records (vLLM numbering), if any."""
        return None

    def layer_family(self, config: dict[str, Any], state: dict[str, Any]) -> str:
        """The decoder-layer family of the draft (`llama` or `qwen3`)."""
        return self.draft_arch

    def algorithm_fields(self, config: dict[str, Any], options: ConvertOptions) -> dict[str, Any]:
        """Top-level config fields of the algorithm beyond the shared ones."""
        return {"norm_before_residual": bool(options.norm_before_residual)}  # the published forwards: raw residual

    def default_speculative_tokens(self, config: dict[str, Any]) -> int:
        return 3  # speculators' EAGLE-3 converter

    def transform(self, state, config, options):
        out = super().transform(state, config, options)
        if "d2t" in out:
            out["d2t"] = out["d2t"].long()
        if "t2d" in out:
            out["t2d"] = out["t2d"].bool()
        return drop_identity_vocab(out, config.get("vocab_size"))

    def build_config(self, config, state, *, verifier, verifier_config, options: ConvertOptions) -> dict[str, Any]:
        if "fc.weight" not in state:
            raise WorkbenchError("no fc.weight: not an EAGLE-3 draft", hint="EAGLE-1/2 heads cannot be converted")
        family = self.layer_family(config, state)
        layer_config = self._layer_config(config, state, verifier_config, family)
        h = int(layer_config["hidden_size"])
        ht, count = _fused_states(config, state, verifier_config, h)
        aux = (options.aux_layer_ids or self.recorded_aux_ids(config)
               or _default_ids(self.algorithm, verifier_config, count))
        if aux and len(aux) != count:
            raise WorkbenchError(f"{len(aux)} aux layer ids {sorted(aux)} but fc.weight fuses {count} verifier "
                                 "states", hint="give as many --aux-layer-ids as fc.weight reads")
        if family == "llama" and count != 3:
            layer_config["num_aux_hidden_states"] = count  # vLLM's Llama EAGLE-3 class ignores top-level ids
        fields: dict[str, Any] = {
            "draft_vocab_size": int(state["lm_head.weight"].shape[0]) if "lm_head.weight" in state
            else int(config.get("draft_vocab_size") or layer_config["vocab_size"]),
            **self.algorithm_fields(config, options),
        }
        if aux:
            fields["eagle_aux_hidden_state_layer_ids"] = sorted(aux)
        if ht != h:
            fields["target_hidden_size"] = ht
        cfg = build_draft_config(self.algorithm, verifier_config=verifier_config or {"architectures": []},
                                 verifier_name=verifier, layer_config=layer_config,
                                 speculative_tokens=(options.speculative_tokens
                                                     or self.default_speculative_tokens(config)),
                                 **fields)
        return cfg.to_dict()

    @staticmethod
    def _layer_config(config, state, verifier_config, family: str) -> dict[str, Any]:
        """The draft decoder's transformer_layer_config from the research config (vocab: the verifier's)."""
        layer = {k: config[k] for k in _LAYER_KEYS if config.get(k) is not None}
        _rope(layer)
        layer["vocab_size"] = int(state["t2d"].shape[0]) if "t2d" in state else int(
            (verifier_config or {}).get("vocab_size") or config.get("vocab_size"))
        if verifier_config and verifier_config.get("max_position_embeddings"):  # as speculators: max of both
            layer["max_position_embeddings"] = max(int(layer.get("max_position_embeddings", 0)),
                                                   int(verifier_config["max_position_embeddings"]))
        num_layers = 1 + max((int(k.split(".")[1]) for k in state if k.startswith("layers.")), default=0)
        overrides = {k: True for k in ("attention_bias", "mlp_bias") if config.get(k)}
        return build_layer_config(layer, model_type=family, num_layers=num_layers, sliding_window=None, **overrides)


def _fused_states(config, state, verifier_config, h: int) -> tuple[int, int]:
    """(target hidden size Ht, number of fused verifier states A) from fc.weight [H, A*Ht]."""
    fc_in = int(state["fc.weight"].shape[1])
    ht = int((verifier_config or {}).get("hidden_size") or config.get("target_hidden_size") or h)
    if fc_in % ht:
        raise WorkbenchError(f"fc.weight has {fc_in} inputs, not a multiple of the target hidden size {ht}",
                             hint="give the draft's own verifier (--target)")
    return ht, fc_in // ht


def drop_identity_vocab(state: dict[str, Any], vocab: int | None) -> dict[str, Any]:
    """Drop d2t [V] / t2d [V] that map the whole vocabulary onto itself (d2t all zeros): vLLM expects none then."""
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None:
        return state
    size = int(t2d.shape[0]) if t2d is not None else int(vocab or 0)
    if int(d2t.shape[0]) == size and not bool(d2t.any()) and (t2d is None or bool(t2d.all())):
        state.pop("d2t")
        state.pop("t2d", None)
    return state


def _default_ids(algorithm: str, verifier_config: dict[str, Any] | None, count: int) -> list[int] | None:
    """The ids vLLM uses when a config records none (for a verifier at hand), written out so every reader agrees."""
    depth = (verifier_config or {}).get("num_hidden_layers")
    if not depth or count != 3:
        return None
    ids = config_type(algorithm).default_aux_layer_ids(int(depth))
    return ids if len(ids) == count else None  # a very shallow verifier: leave them to the user


def has_midlayer(index) -> bool:
    return any(n.startswith("midlayer.") for n in index)


def architectures(config: dict[str, Any]) -> str:
    return " ".join(str(a) for a in config.get("architectures") or [])
