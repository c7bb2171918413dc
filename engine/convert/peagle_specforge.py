"""P-EAGLE as SpecForge's train_peagle.py saves it: `PEagleDraftModel` (`layers.{i}.*`, `mask_hidden`, its own
`embed_tokens`, `d2t`/`t2d`), a Llama config, and `peagle_config.json` beside it with the mask token and depths."""

from __future__ import annotations

import json
from pathlib import Path

from engine.convert.base import CONVERTERS, KeyRule
from engine.convert.eagle3_common import architectures
from engine.convert.peagle_common import MASK_HIDDEN_RULE, OWN_EMBEDDING_RULE, ROTARY_RULE, PEagleSource
from engine.errors import WorkbenchError

SIDECAR = "peagle_config.json"  # num_depths, mask_token_id, norm_before_residual, ... of the training run


@CONVERTERS.register("peagle-specforge")
class PEagleSpecForge(PEagleSource):
    name = "peagle-specforge"
    mask_token_where = f"no mask_token_id in a {SIDECAR} beside config.json (train_peagle.py writes it there)"
    title = "P-EAGLE SpecForge checkpoint (PEagleDraftModel: layers.{i}.*, mask_hidden, peagle_config.json)"
    key_map = (
        KeyRule(r"layers\.(\d+)\.(.+)", r"layers.\1.\2", "decoder layer i (layer 0 reads [embedding; hidden], 2H)"),
        KeyRule(r"fc\.weight", r"fc.weight", "fuses the verifier's aux states [H, A*Ht]"),
        MASK_HIDDEN_RULE,
        KeyRule(r"norm\.weight", r"norm.weight"),
        KeyRule(r"lm_head\.weight", r"lm_head.weight", "draft-vocabulary head [Vd, H]"),
        OWN_EMBEDDING_RULE,
        KeyRule(r"d2t", "d2t", "draft id -> target id offsets (dropped when it maps the full vocabulary)"),
        KeyRule(r"t2d", "t2d", "target tokens in the draft vocabulary"),
        ROTARY_RULE,
    )
    notes = (
        (f"The mask token, the depths K (written as speculative_tokens) and norm_before_residual come from "
         f"{SIDECAR}, which train_peagle.py writes beside config.json; without it give --mask-token-id."),
        ("SpecForge numbers aux layers by their output (eagle_config ids, default [1, N//2-1, N-4]); the config "
         "records vLLM's ids, each one higher (default [2, N//2, N-3])."),
        "The draft keeps its own embedding table (its mask-token row is trained), as vLLM loads P-EAGLE drafts.",
        ("PEagleDraftModel applies plain RoPE with rope_theta whatever rope_scaling says; the converted config "
         "records plain RoPE too."),
    )

    @staticmethod
    def _layer_config(config, state, verifier_config, family):
        """PEagleDraftModel builds a plain LlamaRotaryEmbedding(base=rope_theta): a rope_scaling in its config is
        not applied, so the converted config records plain RoPE with that theta."""
        plain = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_parameters")}
        theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta") or 10000
        plain["rope_theta"] = theta
        return PEagleSource._layer_config(plain, state, verifier_config, family)

    def matches(self, config, index) -> bool:
        return "PEagleDraftModel" in architectures(config) or (
            "mask_hidden" in index and "layers.0.hidden_norm.weight" in index)

    def source_config(self, folder: Path, config):
        sidecar = folder / SIDECAR
        if not sidecar.is_file():
            return config
        try:
            extra = json.loads(sidecar.read_text())
        except (OSError, ValueError) as exc:
            raise WorkbenchError(f"{SIDECAR} is not readable JSON ({exc})", where=str(sidecar),
                                 hint=f"fix or remove {SIDECAR}, and give --mask-token-id") from exc
        return {**config, "peagle_config": extra if isinstance(extra, dict) else {}}

    def recorded_mask_token(self, config):
        return (config.get("peagle_config") or {}).get("mask_token_id")

    def recorded_norm_before_residual(self, config):
        return (config.get("peagle_config") or {}).get("norm_before_residual")

    def recorded_depths(self, config):
        depths = (config.get("peagle_config") or {}).get("num_depths")
        return int(depths) if depths else None

    def recorded_aux_ids(self, config):
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return [int(i) + 1 for i in ids] if ids else None  # SpecForge hooks layer i's output = vLLM id i + 1
