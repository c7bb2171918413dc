"""The toy's own speculators type `toy`: one head over the fused target states, one token per step.

vLLM 0.33 does not serve it (`vllm_served = False`): `validate` says so as a warning and checks the rest, plus the
toy's own rule below."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from engine.format.config import DraftConfig, register_config_type
from engine.format.report import Issue


@register_config_type
class ToyConfig(DraftConfig):
    algorithm: ClassVar[str] = "toy"
    default_architecture: ClassVar[str] = "ToyHead"
    config_class: ClassVar[str] = "ToySpeculatorConfig"
    vllm_served: ClassVar[bool] = False

    speculators_model_type: Literal["toy"] = "toy"
    aux_hidden_state_layer_ids: list[int] | None = None

    @classmethod
    def default_speculative_tokens(cls, fields: dict[str, Any]) -> int:
        return 1

    def max_speculative_tokens(self) -> int | None:
        return 1

    @classmethod
    def validation_rules(cls) -> list:
        return [reads_a_layer]


def reads_a_layer(cfg, typed, hf, report) -> None:
    """The toy head's input is the fused states of at least one target layer."""
    if not cfg.get("aux_hidden_state_layer_ids"):
        report.add(Issue("aux_hidden_state_layer_ids", "the toy head reads no target layer; list the layer ids it "
                         "was trained on (its head's input width is their count x the target's hidden size)"))
