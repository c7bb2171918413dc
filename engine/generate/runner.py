"""The target side of generation: a KV-cached forward that also returns the aux hidden states drafts need."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.generate.cpu_kernels import decode_scope, few_row_linear, linear_form, route_decode_kernels
from engine.targets import LayerCapture, Target

# Families whose logits are exactly lm_head(decoder output): the runner may compute the head itself.
_PLAIN_HEAD = {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral"}


def head_logits(weight: torch.Tensor, hidden: torch.Tensor, *, routed: bool = True,
                form: str = "gemm") -> torch.Tensor:
    """lm_head over hidden [T, H] -> logits [T, V].

    One row is a GEMV (what transformers does); several rows use weight @ hidden^T, which MKL runs
    ~2x faster than the equivalent `linear` for the few-row shapes of speculative verification.
    Routed, it takes the few-row linear of engine.generate.cpu_kernels in the model's form (one row included).
    """
    if routed and hidden.device.type == "cpu":
        return few_row_linear(weight, hidden, form=form)
    if hidden.shape[0] == 1:
        return F.linear(hidden, weight)
    return (weight @ hidden.t()).t()


class TargetRunner:
    """Runs the target over new tokens with a KV cache that can be rolled back.

    `forward(ids)` returns logits (fp32) for the last position (`all_logits=False`, e.g. prefill) or every
    position, and, when `aux_layer_ids` is set, the residual stream at those layers [T, A*H] (ascending
    layer order, concatenated), captured by hooks during the same pass.
    """

    def __init__(self, target: Target, aux_layer_ids: list[int] | None = None, *,
                 route_kernels: bool | None = None):
        self.target = target
        self.model = target.model
        self.aux_layer_ids = sorted(set(aux_layer_ids)) if aux_layer_ids else None
        self.cache = None
        model_type = getattr(target.text_config, "model_type", "")
        head = target.lm_head()
        self._head = head.weight if model_type in _PLAIN_HEAD and getattr(head, "bias", None) is None else None
        # bf16 on CPU: fast few-row kernels, row-invariant (exact speculation). None = what the kernel choice
        # (engine.generate.kernel_choice, in target.extra) decided, routed when no choice was made; False keeps
        # transformers' own kernels: routing changes the shared model for every runner.
        if route_kernels is None:
            route_kernels = target.extra.get("route_kernels", True)
        self.routed = route_kernels and route_decode_kernels(self.model)
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        # sliding-window layers (Mistral, Gemma, gpt-oss) keep the states past their window until the next crop, so
        # rejected drafts can be rolled back once the context is longer than the window
        self.cache.activate_past_recording()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @property
    def max_length(self) -> int:
        return int(getattr(self.target.text_config, "max_position_embeddings", 1 << 30))

    def _logits(self, input_ids: torch.Tensor, all_logits: bool) -> torch.Tensor:
        if self._head is None:
            out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=0 if all_logits else 1)
            return out.logits[0].float()
        hidden = self.model.get_decoder()(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
        h = hidden.last_hidden_state[0]  # [T, H]
        return head_logits(self._head, h if all_logits else h[-1:], routed=self.routed,
                           form=linear_form(self.model)).float()

    @torch.inference_mode()
    def forward(self, ids: list[int] | torch.Tensor, *, all_logits: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [T or 1, V] and aux states [T, A*H] (or None)."""
        input_ids = torch.as_tensor(ids, dtype=torch.long, device=self.target.device).view(1, -1)
        if self.aux_layer_ids is None:
            with decode_scope():
                return self._logits(input_ids, all_logits), None
        with LayerCapture(self.model, self.aux_layer_ids) as cap, decode_scope():
            logits = self._logits(input_ids, all_logits)
        aux = torch.cat([cap.captured[i][0] for i in cap.layer_ids], dim=-1)  # [T, A*H]
        return logits, aux

    def crop(self, length: int) -> None:
        """Forget cached positions >= length (rejected draft tokens)."""
        drop = self.length - length
        self.cache.crop(-drop if drop > 0 else 0)  # crop(0) trims sliding-window layers back to their window
