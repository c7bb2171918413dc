"""DSpark as DeepSpec publishes it (deepseek-ai/dspark_qwen3_*: `Qwen3DSparkModel`): DFlash's Qwen3 backbone with
`markov_head.*` and `confidence_head.*`, copies of the verifier's embedding and head, and a config with
`target_layer_ids` numbered by layer output (-1: the embeddings), `block_size` and the head settings."""

from __future__ import annotations

from typing import Any

from engine.convert.base import CONVERTERS, Converter, ConvertOptions, KeyRule
from engine.convert.eagle3_common import architectures
from engine.errors import WorkbenchError
from engine.format.config import build_draft_config
from engine.format.vllm_rules import RULES_LABEL

_LAYER_PARTS = (r"self_attn\.(?:q_proj|k_proj|v_proj|o_proj)\.(?:weight|bias)|self_attn\.(?:q_norm|k_norm)\.weight|"
                r"mlp\.(?:gate_proj|up_proj|down_proj)\.weight|input_layernorm\.weight|post_attention_layernorm\.weight")
# DeepSpec's own config fields (read into the speculators fields), not part of the decoder's layer config
_DEEPSPEC_KEYS = {"architectures", "auto_map", "target_layer_ids", "num_target_layers", "block_size", "mask_token_id",
                  "num_anchors", "enable_confidence_head", "confidence_head_with_markov", "markov_rank",
                  "markov_head_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path"}


@CONVERTERS.register("dspark-deepspec")
class DSparkDeepSpec(Converter):
    name = "dspark-deepspec"
    precedence = 15
    title = "DSpark DeepSpec checkpoint (Qwen3DSparkModel: target_layer_ids read as hidden_states[id + 1])"
    algorithm = "dspark"
    options = ("mask_token_id", "aux_layer_ids", "speculative_tokens")
    key_map = (
        KeyRule(rf"layers\.(\d+)\.({_LAYER_PARTS})", r"layers.\1.\2",
                "a Qwen3 block layer (context rows as extra K/V)"),
        KeyRule(r"fc\.weight", r"fc.weight", "fuses the verifier's aux states [H, A*H]"),
        KeyRule(r"(hidden_norm|norm)\.weight", r"\1.weight"),
        KeyRule(r"markov_head\.(markov_w1|markov_w2)\.weight", r"markov_head.\1.weight",
                "the Markov head: W1 [V, r] by the previous token, W2 [V, r]"),
        KeyRule(r"markov_head\.(gate_proj|joint_proj)\.(weight|bias)", r"markov_head.\1.\2",
                "the gated / rnn Markov head's extra projection"),
        KeyRule(r"confidence_head\.proj\.(weight|bias)", r"confidence_head.proj.\1",
                "the confidence head [1, H (+r)]"),
        KeyRule(r"embed_tokens\.weight", None, "DeepSpec's frozen copy of the verifier's embedding: vLLM shares it"),
        KeyRule(r"lm_head\.weight", None, "DeepSpec's frozen copy of the verifier's full-vocabulary head: shared"),
        KeyRule(r"rotary_emb\..+", None, "RoPE tables, recomputed from the config"),
    )
    notes = (
        ("DeepSpec numbers target layers by their output (`hidden_states[id + 1]`, -1 the embeddings); the "
         "converted config records vLLM's ids (each one higher)."),
        ("Every block slot predicts (the anchor drafts the next token), so speculative_tokens is the block size; "
         "the slots of a block attend to each other in both directions, as DeepSpec trains them."),
        ("embed_tokens and lm_head are DeepSpec's frozen copies of the verifier's: they are dropped and the "
         "verifier's own are used, as vLLM does."),
        (f"{RULES_LABEL}'s Qwen3 DSpark class has the vanilla Markov head only: a gated or rnn head's extra "
         "projection is listed as a tensor it cannot load, and the conversion stops."),
    )

    def matches(self, config: dict[str, Any], index) -> bool:
        return "DSpark" in architectures(config) or (
            "markov_head.markov_w1.weight" in index and "target_layer_ids" in config)

    def build_config(self, config, state, *, verifier, verifier_config, options: ConvertOptions) -> dict[str, Any]:
        layer_config = self._layer_config(config)
        aux = self.aux_ids(config, options)
        _check_verifier(config, verifier_config, aux)
        block = config.get("block_size")
        if not block:
            raise WorkbenchError("the config records no block_size", hint="is this a DeepSpec DSpark checkpoint?")
        rank = int(config.get("markov_rank") or 0)
        confidence = bool(config.get("enable_confidence_head", False))
        cfg = build_draft_config(
            "dspark", verifier_config=verifier_config or {"architectures": []}, verifier_name=verifier,
            layer_config=layer_config, speculative_tokens=options.speculative_tokens or int(block),
            block_size=int(block), draft_vocab_size=int(config["vocab_size"]),
            aux_hidden_state_layer_ids=aux, mask_token_id=self.mask_token(config, options),
            sample_from_anchor=True, sliding_window_non_causal=True,  # DeepSpec: bidirectional within a block
            markov_rank=rank, markov_head_type=str(config.get("markov_head_type") or "vanilla"),
            enable_confidence_head=confidence,
            confidence_head_with_markov=bool(config.get("confidence_head_with_markov", rank > 0)) and confidence,
        )
        return cfg.to_dict()

    @staticmethod
    def _layer_config(config: dict[str, Any]) -> dict[str, Any]:
        """The draft decoder's config: DeepSpec's (a copy of the verifier's with the draft's depth) minus its own
        fields. vLLM 0.33 serves Qwen3 DSpark drafts only."""
        model_type = config.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise WorkbenchError(f"a DeepSpec DSpark draft with {model_type} layers: {RULES_LABEL} loads only Qwen3 "
                                 "DSpark drafts (Qwen3DSparkModel)",
                                 hint="convert a Qwen3 DSpark draft, or train one with "
                                 "the workbench (python -m engine train --algo dspark)")
        return {k: v for k, v in config.items() if k not in _DEEPSPEC_KEYS}

    @staticmethod
    def aux_ids(config: dict[str, Any], options: ConvertOptions) -> list[int]:
        if options.aux_layer_ids:
            return sorted(options.aux_layer_ids)  # given in vLLM's numbering
        ids = config.get("target_layer_ids")
        if not ids:
            raise WorkbenchError("the config records no target_layer_ids", hint="give --aux-layer-ids (vLLM "
                                 "numbering: id k = the input of layer k)")
        return [int(i) + 1 for i in ids]  # hidden_states[id + 1] is the input of layer id + 1; -1 -> 0

    @staticmethod
    def mask_token(config: dict[str, Any], options: ConvertOptions) -> int:
        mask = options.mask_token_id if options.mask_token_id is not None else config.get("mask_token_id")
        if mask is None:
            raise WorkbenchError("the source records no mask token (mask_token_id)",
                                 hint="give --mask-token-id (the id the draft was trained with)")
        return int(mask)


def _check_verifier(config: dict[str, Any], verifier_config: dict[str, Any] | None, aux: list[int]) -> None:
    """A DeepSpec draft has its verifier's width and vocabulary, and reads layers 0..N of it."""
    if not verifier_config:
        return
    text = verifier_config.get("text_config", verifier_config) if "hidden_size" not in verifier_config \
        else verifier_config
    for what, key in (("hidden size", "hidden_size"), ("vocabulary", "vocab_size")):
        theirs, ours = text.get(key), config.get(key)
        if theirs and ours and int(theirs) != int(ours):
            raise WorkbenchError(f"the verifier's {what} is {theirs}, the draft's is {ours}: not the draft's verifier",
                                 hint="give the verifier the draft was trained on (--target)")
    depth = text.get("num_hidden_layers")
    if depth and any(not 0 <= i <= int(depth) for i in aux):
        raise WorkbenchError(f"aux layer ids {aux} do not fit a {depth}-layer verifier (0..{depth})",
                             hint="give the verifier the draft was trained on (--target), or --aux-layer-ids")
