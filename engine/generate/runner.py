"""The target side of generation: a KV-cached forward that also returns the aux hidden states drafts need."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.generate.cpu_kernels import (
    PACKED_FORMS,
    decode_scope,
    few_row_linear,
    linear_form,
    packed_weight,
    route_decode_kernels,
)
from engine.generate.fused_decoder import FusedDecoder, fused_problem
from engine.targets.capture import LayerCapture, decoder_of
from engine.targets.loading import Target

# Families whose logits are exactly lm_head(decoder output): the runner may compute the head itself.
_PLAIN_HEAD = {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral"}


def head_logits(weight: torch.Tensor, hidden: torch.Tensor, *, routed: bool = True,
                form: str = "gemm", packed: torch.Tensor | None = None) -> torch.Tensor:
    """lm_head over hidden [T, H] -> logits [T, V].

    One row is a GEMV (what transformers does); several rows use weight @ hidden^T, which MKL runs
    ~2x faster than the equivalent `linear` for the few-row shapes of speculative verification.
    Routed, it takes the few-row linear of engine.generate.cpu_kernels in the model's form (one row included).
    """
    if routed and hidden.device.type == "cpu":
        return few_row_linear(weight, hidden, form=form, packed=packed)
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
                 route_kernels: bool | None = None, fused: bool | None = None):
        self.target = target
        self.model = target.model
        self.aux_layer_ids = sorted(set(aux_layer_ids)) if aux_layer_ids else None
        self.cache = None
        model_type = getattr(target.text_config, "model_type", "")
        head = target.lm_head()
        self._head = head.weight if model_type in _PLAIN_HEAD and getattr(head, "bias", None) is None else None
        self._head_module = head  # where a packed copy of the head's weight is kept (packed-pad2)
        # bf16 on CPU: fast few-row kernels, row-invariant (exact speculation). None = what the kernel choice
        # (engine.generate.kernel_choice, in target.extra) decided, routed when no choice was made; False keeps
        # transformers' own kernels: routing changes the shared model for every runner.
        if route_kernels is None:
            route_kernels = target.extra.get("route_kernels", True)
        self.routed = route_kernels and route_decode_kernels(self.model)
        # the decoder layers as one plain forward (engine.generate.fused_decoder), where the kernel choice took it
        if fused is None:
            fused = target.extra.get("fused_decoder", False)
        self.fused = bool(fused) and self._head is not None and fused_problem(self.model) is None
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        if self.fused:
            self.cache = FusedDecoder(self.model)
            self._fed, self._anchor = [], None
            return
        self.cache = DynamicCache(config=self.model.config)
        # sliding-window layers (Mistral, Gemma, gpt-oss) keep the states past their window until the next crop, so
        # rejected drafts can be rolled back once the context is longer than the window; linear-attention layers keep
        # their convolution inputs likewise
        self.cache.activate_past_recording()
        self._fed: list[int] = []  # the ids the cache holds, in order (replayed when recurrent state is rewound)
        self._anchor: tuple[int, list[torch.Tensor]] | None = None  # length, recurrent states before the last forward

    @property
    def length(self) -> int:
        return self.cache.length if self.fused else self.cache.get_seq_length()

    @property
    def max_length(self) -> int:
        return int(getattr(self.target.text_config, "max_position_embeddings", 1 << 30))

    def _logits(self, input_ids: torch.Tensor, all_logits: bool) -> torch.Tensor:
        if self._head is None:
            out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=0 if all_logits else 1)
            return out.logits[0].float()
        hidden = decoder_of(self.model)(input_ids=input_ids, past_key_values=self.cache, use_cache=True)
        h = hidden.last_hidden_state[0]  # [T, H]
        form = linear_form(self.model)
        packed = packed_weight(self._head_module, self._head) if form in PACKED_FORMS and self.routed else None
        return head_logits(self._head, h if all_logits else h[-1:], routed=self.routed, form=form,
                           packed=packed).float()

    @torch.inference_mode()
    def forward(self, ids: list[int] | torch.Tensor, *, all_logits: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [T or 1, V] and aux states [T, A*H] (or None)."""
        input_ids = torch.as_tensor(ids, dtype=torch.long, device=self.target.device).view(1, -1)
        if self.fused:
            return self._fused_forward(input_ids[0], all_logits)
        if self.aux_layer_ids is None:
            with decode_scope():
                return self._advance(input_ids, all_logits), None
        with LayerCapture(self.model, self.aux_layer_ids) as cap, decode_scope():
            logits = self._advance(input_ids, all_logits)
        aux = torch.cat([cap.captured[i][0] for i in cap.layer_ids], dim=-1)  # [T, A*H]
        return logits, aux

    def _fused_forward(self, input_ids: torch.Tensor, all_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids [T] through the fused decoder: logits [T or 1, V] and aux states [T, A*H] (or None)."""
        hidden, captured = self.cache.forward(input_ids, self.aux_layer_ids)  # [T, H]
        h = self.cache.final_norm(hidden if all_logits else hidden[-1:])
        packed = packed_weight(self._head_module, self._head) if self.routed and self.cache.weights.packed else None
        logits = head_logits(self._head, h, routed=self.routed, form=linear_form(self.model), packed=packed).float()
        aux = None if self.aux_layer_ids is None else torch.cat([captured[i] for i in self.aux_layer_ids], dim=-1)
        return logits, aux

    def _advance(self, input_ids: torch.Tensor, all_logits: bool) -> torch.Tensor:
        """One forward over input_ids [1, T]; recurrent states are kept first, so a crop can rewind them."""
        states = self._recurrent_states()
        self._anchor = (self.length, [s.clone() for s in states]) if states else None
        logits = self._logits(input_ids, all_logits)
        self._fed.extend(input_ids[0].tolist())
        return logits

    def _recurrent_states(self) -> list[torch.Tensor]:
        """The state tensors of linear-attention layers (Gated DeltaNet, Mamba): updated in place, never croppable."""
        return [layer.recurrent_states[i] for layer in self.cache.layers
                for i, on in getattr(layer, "is_recurrent_states_initialized", {}).items() if on]

    def crop(self, length: int) -> None:
        """Forget cached positions >= length (rejected draft tokens)."""
        if self.fused:
            self.cache.crop(length)
            return
        drop = self.length - length
        if drop > 0 and self._recurrent_states():
            self._rewind(length)
            return
        self.cache.crop(-drop if drop > 0 else 0)  # crop(0) trims sliding-window layers back to their window
        del self._fed[max(length, 0):]

    @torch.inference_mode()
    def _rewind(self, length: int) -> None:
        """Recurrent state has no positions to crop: restore it from before the last forward (the whole cache back
        to that length) and run the kept tokens again; from the start when the anchor lies past `length`."""
        keep = self._fed[:length]
        anchor = self._anchor
        if anchor is None or anchor[0] > length:
            self.reset()
            start = 0
        else:
            start, saved = anchor
            self.cache.crop(-(self.length - start))  # attention KV and convolution inputs back to `start`
            for state, old in zip(self._recurrent_states(), saved, strict=True):
                state.copy_(old)
            del self._fed[start:]
        if len(keep) > start:
            ids = torch.as_tensor(keep[start:], dtype=torch.long, device=self.target.device).view(1, -1)
            with decode_scope():
                self._advance(ids, all_logits=False)


# -- the rollback guard: speculation is lossless only if verify-then-crop equals one-token steps ---------------------

_PROBE_PREFIX, _PROBE_K = 12, 3  # a prefix longer than the tiny test targets' sliding windows; k drafted tokens


def _probe_ids(vocab_size: int, n: int) -> list[int]:
    return [(7 * i + 5) % vocab_size for i in range(n)]  # varied, deterministic ids


def rollback_problem(target: Target) -> str | None:
    """Why speculative decoding would not be lossless on this target (None when it would), measured: a multi-token
    verify must give the logits of a full forward, and after cropping the rejected tokens the cache must give what
    one-token steps give. Families whose cache keeps state a crop cannot undo (recurrent linear-attention layers)
    or that fail on a multi-token step fail here. Measured once per target and dtype (kept in `target.extra`)."""
    key = f"rollback_problem:{target.dtype}"
    if key not in target.extra:
        target.extra[key] = _measure_rollback(target)
    return target.extra[key]


def _measure_rollback(target: Target) -> str | None:
    p, k = _PROBE_PREFIX, _PROBE_K
    ids = _probe_ids(int(target.vocab_size), p + k)
    runner = TargetRunner(target)
    try:
        full, _ = runner.forward(ids)  # [P+K, V]: one pass, nothing cached before
        runner.reset()
        runner.forward(ids[:p], all_logits=False)
        verify, _ = runner.forward(ids[p:p + k])  # [K, V] as a speculative step verifies
        runner.crop(p + 1)  # accept one token: forget ids[p+1:]
        after, _ = runner.forward([ids[p + 1]])  # [1, V]: must be position p+1 again
    except Exception as exc:  # noqa: BLE001 - whatever fails here would fail mid-generation
        return (f"this target's model ({type(target.model).__name__}) fails when it verifies several tokens with a "
                f"cache ({type(exc).__name__}: {str(exc)[:160]})")
    finally:
        runner.reset()
    scale = float(full.abs().max()) + 1.0
    tol = (1e-3 if target.dtype == torch.float32 else 5e-2) * scale
    worst = max(float((verify - full[p:p + k]).abs().max()), float((after[0] - full[p + 1]).abs().max()))
    if worst <= tol:
        return None
    return (f"this target's cache cannot be rolled back exactly: after a {k}-token verify and a rollback its logits "
            f"differ from one-token steps by {worst:.3g} (logits up to {scale - 1:.3g}); families with recurrent "
            "(linear-attention) layers keep state over rejected tokens, so a draft would change the output")
