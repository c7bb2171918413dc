"""The target side of generation: a KV-cached forward that also returns the aux hidden states drafts need."""

from __future__ import annotations

import torch

from engine.targets import LayerCapture, Target


class TargetRunner:
    """Runs the target over new tokens with a KV cache that can be rolled back.

    `forward(ids)` returns logits [T, V] (fp32) and, when `aux_layer_ids` is set, the residual stream at
    those layers [T, A*H] (ascending layer order, concatenated), captured by hooks during the same pass.
    """

    def __init__(self, target: Target, aux_layer_ids: list[int] | None = None):
        self.target = target
        self.model = target.model
        self.aux_layer_ids = sorted(set(aux_layer_ids)) if aux_layer_ids else None
        self.cache = None
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @property
    def max_length(self) -> int:
        return int(getattr(self.target.text_config, "max_position_embeddings", 1 << 30))

    @torch.inference_mode()
    def forward(self, ids: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_ids = torch.as_tensor(ids, dtype=torch.long, device=self.target.device).view(1, -1)
        if self.aux_layer_ids is None:
            out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
            return out.logits[0].float(), None
        with LayerCapture(self.model, self.aux_layer_ids) as cap:
            out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
        aux = torch.cat([cap.captured[i][0] for i in cap.layer_ids], dim=-1)  # [T, A*H]
        return out.logits[0].float(), aux

    def crop(self, length: int) -> None:
        """Forget cached positions >= length (rejected draft tokens)."""
        drop = self.length - length
        if drop > 0:
            self.cache.crop(-drop)
