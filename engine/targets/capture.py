"""Capture a target's residual stream at layer ids with vLLM's and speculators' semantics, with hooks."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
from torch import nn

from engine.errors import WorkbenchError


class _StopForward(Exception):
    """Raised from a hook to end a forward once every requested layer has been captured."""


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM, the module holding `layers` and the final `norm`: what `get_decoder()`
    returns, else its `model` (transformers' Llama 4 returns the whole model from `get_decoder()`)."""
    found = model.get_decoder() if hasattr(model, "get_decoder") else None
    for candidate in (found, getattr(model, "model", None)):
        if isinstance(getattr(candidate, "layers", None), nn.ModuleList) and hasattr(candidate, "norm"):
            return candidate
    raise WorkbenchError(f"cannot find the decoder layers of this target ({type(model).__name__}): the workbench reads "
                         "hidden states before `layers[i]` and the final `norm` of its decoder, and this model has no "
                         "such stack", hint="this family is not supported yet; use a family of the families table "
                         "in docs/families.md")


class LayerCapture:
    """Capture the residual stream at layer ids with hooks (no `output_hidden_states` tuple)."""
    # Layer id k < N is the input of decoder layer k (= HF `hidden_states[k]`, id 0 = embeddings);
    # id N is the last layer's output BEFORE the final norm (HF's `hidden_states[-1]` is after it).
    # Captured tensors are cloned: transformers may modify the hooked tensor in place afterwards.
    # Hooks sit on the (shared) model but capture only forwards run by the thread that entered the capture: the app
    # serves several browser sessions from one cached target, each generating in its own thread.

    def __init__(self, model: nn.Module, layer_ids: Iterable[int], *, stop_early: bool = False):
        self.decoder = decoder_of(model)
        self.num_layers = len(self.decoder.layers)
        self.layer_ids = sorted(set(int(i) for i in layer_ids))
        bad = [i for i in self.layer_ids if not 0 <= i <= self.num_layers]
        if bad:
            raise WorkbenchError(
                f"layer ids {bad} are outside 0..{self.num_layers} for this {self.num_layers}-layer target",
                hint=f"use ids between 0 and {self.num_layers} ({self.num_layers} = last layer before the norm)",
            )
        self.stop_early = stop_early
        self.captured: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def _hook_for(self, layer_id: int):
        def hook(module, args, kwargs=None):
            # kwargs=None: torch registers a kwargs hook in two steps, so another thread's forward running in
            # between calls it without kwargs; that call is another session's and is ignored below
            if threading.get_ident() != self._thread:
                return  # another session's forward through the same model
            hidden = args[0] if args else kwargs["hidden_states"]
            self.captured[layer_id] = hidden.detach().clone()
            if self.stop_early and layer_id == self.layer_ids[-1]:
                raise _StopForward
        return hook

    def __enter__(self) -> LayerCapture:
        self._thread = threading.get_ident()
        for i in self.layer_ids:
            module = self.decoder.layers[i] if i < self.num_layers else self.decoder.norm
            self._handles.append(module.register_forward_pre_hook(self._hook_for(i), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> bool:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return exc[0] is _StopForward  # swallow our own early-stop signal

    def stacked(self) -> torch.Tensor:
        """[B, T, L, H] in ascending layer id order."""
        return torch.stack([self.captured[i] for i in self.layer_ids], dim=2)


@torch.inference_mode()
def capture_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    layer_ids: Iterable[int],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the decoder (no lm_head) and return hidden states [B, T, L, H] at `layer_ids` (sorted)."""
    capture = LayerCapture(model, layer_ids, stop_early=True)
    with capture:
        capture.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return capture.stacked()

