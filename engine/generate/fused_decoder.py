"""One plain forward over a Llama-like target's decoder layers for CPU decoding: fused linears, no module overhead."""

# transformers runs a decode step through ~20 module calls, cache and mask bookkeeping per layer; on a small target
# that overhead is as large as the weight reads (BENCHMARKS.md, issue 50). Here a step is a loop over the layers with
# the query/key/value and gate/up linears each fused into one weight (packed once for oneDNN where its packed
# linear runs in the weights' dtype: bf16 natively, fp32), the norms, RoPE and activation taken from the model's own
# modules, the attention of engine.generate.cpu_kernels' "eager-masked" form, and a key/value cache of preallocated
# tensors. Only layer layouts whose every step this reproduces qualify (`fused_problem`); the kernel choice measures
# the path like any other (row-exactness included) and takes it only where it is exact and fastest. `FusedBatch` runs
# the same layers for several sequences at once (greedy data answers), each at its own position.

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from engine.generate.cpu_kernels import masked_rows_attention, packed_linear_available, packed_weight, pad2_linear
from engine.targets.capture import decoder_of

FUSED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")  # decoder layers of exactly this layout (`fused_problem`)
_LAYER_CLASSES = tuple(f"{p}DecoderLayer" for p in ("Llama", "Qwen2", "Qwen3", "Mistral"))
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
PREFILL_CHUNK = 256  # prompt rows per forward: bounds the masked attention's [rows, keys] scores
FIRST_ANSWER_ROOM = 256  # answer positions a FusedBatch's cache holds before it grows (most answers end before)
_WEIGHTS = "_workbench_fused_weights"


def fused_problem(model: nn.Module) -> str | None:
    """Why `model`'s decode steps cannot run fused here, or None when they can."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    if config.model_type not in FUSED_FAMILIES:
        return f"model type {config.model_type!r} is not one of {', '.join(FUSED_FAMILIES)}"
    decoder = decoder_of(model)
    if any(type(layer).__name__ not in _LAYER_CLASSES for layer in decoder.layers):
        return "a decoder layer is not the family's plain attention + MLP layer"
    types = getattr(config, "layer_types", None)
    if (any(t != "full_attention" for t in types) if types is not None
            else getattr(config, "sliding_window", None) is not None):
        return "sliding-window attention layers"
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(isinstance(getattr(attn, n, None), nn.Linear) for n in _ATTENTION) or \
                not all(isinstance(getattr(mlp, n, None), nn.Linear) for n in _MLP):
            return "a layer's attention or MLP is not made of plain linears"
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention layers"
        if len({getattr(attn, n).bias is None for n in _ATTENTION[:3]}) > 1:
            return "some of a layer's query, key and value projections have a bias and some do not"
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return "the output head is not a plain linear"
    p = next(model.parameters())
    if p.device.type != "cpu":
        return "the fused decoder runs on CPU only"
    return None


@dataclass
class _Layer:
    """One decoder layer's fused weights and the modules whose own forward the step calls."""

    qkv: torch.Tensor  # [(Hq + 2 Hkv) d, H] (packed for oneDNN where `packed`)
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [2 I, H]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    module: nn.Module


def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if tensors[0] is None else torch.cat([t.detach() for t in tensors]).contiguous()


class _Weights:
    """The fused weights of a model, built once and shared by every runner of it (read-only)."""

    def __init__(self, model: nn.Module):
        p = next(model.parameters())
        self.packed = packed_linear_available(p.dtype)  # fp32 too: oneDNN's packed fp32 linear beats F.linear
        self.layers = []
        for layer in decoder_of(model).layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [getattr(attn, n) for n in _ATTENTION[:3]]
            gate_up = [mlp.gate_proj, mlp.up_proj]
            self.layers.append(_Layer(
                qkv=self._weight(_cat([m.weight for m in qkv])), qkv_bias=_cat([m.bias for m in qkv]),
                o=self._weight(attn.o_proj.weight), o_bias=_bias(attn.o_proj),
                gate_up=self._weight(_cat([m.weight for m in gate_up])),
                gate_up_bias=_cat([m.bias for m in gate_up]),
                down=self._weight(mlp.down_proj.weight), down_bias=_bias(mlp.down_proj), module=layer))
        self.sizes = [getattr(layer.self_attn, n).out_features for n in _ATTENTION[:3]]
        self.inter = decoder_of(model).layers[0].mlp.gate_proj.out_features
        self.head_dim = decoder_of(model).layers[0].self_attn.head_dim

    def _weight(self, w: torch.Tensor) -> torch.Tensor:
        w = w.detach().contiguous()
        return torch.ops.mkldnn._reorder_linear_weight(w, 2) if self.packed else w

    def linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [R, in] -> [R, out]; one row padded to two, as the routed "pad2" forms (a row-invariant GEMM)."""
        return pad2_linear(x, w, bias, packed=w if self.packed else None)

    def qkv(self, layer: _Layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [R, H] -> q [R, Hq, d], k and v [R, Hkv, d] before RoPE: the input norm, the joined projection and,
        for Qwen3, the per-head norms."""
        attn, rows, d = layer.module.self_attn, x.shape[0], self.head_dim
        h = layer.module.input_layernorm.forward(x)
        q, k, v = self.linear(h, layer.qkv, layer.qkv_bias).split(self.sizes, dim=-1)  # [R, Hq d], [R, Hkv d] x2
        q, k, v = q.view(rows, -1, d), k.view(rows, -1, d), v.view(rows, -1, d)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm.forward(q), attn.k_norm.forward(k)
        return q, k, v

    def rest(self, layer: _Layer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """x [R, H] and the attention's output [R, Hq d] -> the layer's output [R, H]: the output projection and the
        MLP, each added to the residual stream."""
        module = layer.module
        x = x + self.linear(attended, layer.o, layer.o_bias)
        h = module.post_attention_layernorm.forward(x)
        gate, up = self.linear(h, layer.gate_up, layer.gate_up_bias).split(self.inter, dim=-1)  # [R, I] each
        return x + self.linear(module.mlp.act_fn(gate) * up, layer.down, layer.down_bias)


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()


def has_fused_weights(model: nn.Module) -> bool:
    """Whether the model's fused weights (its second copy of the linear weights) are built already."""
    return _WEIGHTS in model.__dict__


def fused_weights(model: nn.Module) -> _Weights:
    """The model's fused weights, built at the first call (a second copy of the layers' linear weights)."""
    weights = model.__dict__.get(_WEIGHTS)
    if weights is None:
        weights = model.__dict__[_WEIGHTS] = _Weights(model)
    return weights


class FusedDecoder:
    """Decode forwards of one sequence over a fused model, with its own key/value cache (rolled back by `crop`);
    `cache` (keys, values [L, Hkv, capacity, d]) holding `length` positions starts it on given tensors."""

    def __init__(self, model: nn.Module, cache: tuple[torch.Tensor, torch.Tensor] | None = None, length: int = 0):
        self.model = model
        self.decoder = decoder_of(model)
        self.weights = fused_weights(model)
        attn = self.decoder.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = attn.config.num_key_value_heads
        self.length = length
        self._k, self._v = cache or (None, None)  # [L, Hkv, capacity, d] each

    def crop(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def _room(self, n: int, dtype: torch.dtype) -> None:
        """Grow the cache (doubling) to hold n positions."""
        have = 0 if self._k is None else self._k.shape[2]
        if n <= have:
            return
        size = max(n, 2 * have, 256)
        shape = (len(self.weights.layers), self.kv_heads, size, self.head_dim)
        k, v = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
        if self._k is not None:
            k[:, :, :have], v[:, :, :have] = self._k, self._v
        self._k, self._v = k, v

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, capture: list[int] | None = None
                ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """input_ids [T] -> the residual stream after the last layer [T, H] (before the final norm) and, for each
        layer id in `capture`, the stream at it (id i < N: the input of layer i; N: that last output)."""
        captured: dict[int, torch.Tensor] = {}
        outs = []
        for start in range(0, input_ids.shape[0], PREFILL_CHUNK):
            out, parts = self._chunk(input_ids[start:start + PREFILL_CHUNK], capture or [])
            outs.append(out)
            for i, part in parts.items():
                captured.setdefault(i, []).append(part)
        return torch.cat(outs), {i: torch.cat(parts) for i, parts in captured.items()}

    def _chunk(self, ids: torch.Tensor, capture: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        rows, start = ids.shape[0], self.length
        end = start + rows
        x = self.decoder.embed_tokens(ids.view(1, -1))  # [1, T, H]
        cos, sin = self.decoder.rotary_emb(x, torch.arange(start, end).view(1, -1))  # [1, T, d] each
        x = x[0]  # [T, H]
        self._room(end, x.dtype)
        captured = {}
        w, n = self.weights, len(self.weights.layers)
        for i, layer in enumerate(w.layers):
            if i in capture:
                captured[i] = x
            x = self._layer(i, layer, x, cos, sin, start, end)
        if n in capture:
            captured[n] = x
        self.length = end
        return x, captured

    def _layer(self, i: int, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
               end: int) -> torch.Tensor:
        """x [T, H] -> [T, H]: one decoder layer, its new keys and values written to cache positions [start, end)."""
        q, k, v = (t.transpose(0, 1) for t in self.weights.qkv(layer, x))  # [heads, T, d]
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        self._k[i, :, start:end], self._v[i, :, start:end] = k, v
        out = masked_rows_attention(q, self._k[i, :, :end], self._v[i, :, :end],
                                    layer.module.self_attn.scaling)  # [T, Hq, d]
        return self.weights.rest(layer, x, out.reshape(x.shape[0], -1))

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder.norm.forward(x)


class FusedBatch:
    """Decode steps of several sequences at once over a fused model: one linear per weight for all rows, each row at
    its own position over its own cache length (greedy data answers: `regenerate` and the one pass)."""

    def __init__(self, model: nn.Module, rows: int, capacity: int):
        self.model = model
        self.decoder = decoder_of(model)
        self.weights = fused_weights(model)
        attn = self.decoder.layers[0].self_attn
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        shape = (len(self.weights.layers), rows, attn.config.num_key_value_heads, capacity, attn.head_dim)
        dtype = next(model.parameters()).dtype
        # zeros, not empty: keys past a row's length are masked out, but a stale NaN among their values would still
        # reach the output (0 x NaN)
        self._k, self._v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)  # [L, B, Hkv, C, d]
        self.lengths = torch.zeros(rows, dtype=torch.long)  # [B] cached positions per row

    def _room(self, n: int) -> None:
        """Grow every row's cache (doubling) to hold n positions: it starts small and grows with the longest row."""
        have = self._k.shape[3]
        if n <= have:
            return
        shape = (*self._k.shape[:3], max(n, 2 * have), self._k.shape[4])
        k, v = self._k.new_zeros(shape), self._v.new_zeros(shape)
        k[:, :, :, :have], v[:, :, :, :have] = self._k, self._v
        self._k, self._v = k, v

    def row(self, b: int, length: int | None = None) -> FusedDecoder:
        """A one-sequence decoder on row b's cache (its first `length` positions; all of them by default). It writes
        into the batch's cache until it outgrows the capacity, then into its own copy."""
        return FusedDecoder(self.model, (self._k[:, b], self._v[:, b]),  # [L, Hkv, C, d] views
                            int(self.lengths[b]) if length is None else length)

    @torch.inference_mode()
    def prefill(self, b: int, ids: torch.Tensor, capture: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Row b's prompt ids [T] alone (no padding): `FusedDecoder.forward`'s outputs; the row's length becomes T."""
        self._room(ids.shape[0])
        one = self.row(b, 0)
        out = one.forward(ids, capture)
        self.lengths[b] = one.length
        return out

    @torch.inference_mode()
    def keep(self, rows: list[int]) -> None:
        """Only batch rows `rows` go on (in this order): the others' caches are dropped."""
        index = torch.tensor(rows, dtype=torch.long)
        self._k, self._v = self._k.index_select(1, index), self._v.index_select(1, index)
        self.lengths = self.lengths[index]

    @torch.inference_mode()
    def step(self, ids: torch.Tensor, capture: list[int] | None = None
             ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """ids [B] (one new token per row, at the row's length) -> the last layer's output [B, H] (before the final
        norm) and the stream at each `capture` id [B, H], as `FusedDecoder.forward`."""
        positions = self.lengths  # [B]
        self._room(int(positions.max()) + 1)
        x = self.decoder.embed_tokens(ids)  # [B, H]
        cos, sin = self.decoder.rotary_emb(x[:, None], positions[:, None])  # [B, 1, d] each
        seen = torch.arange(int(positions.max()) + 1) <= positions[:, None]  # [B, n]: keys each row attends to
        captured, n = {}, len(self.weights.layers)
        for i, layer in enumerate(self.weights.layers):
            if i in (capture or ()):
                captured[i] = x
            x = self._layer(i, layer, x, cos, sin, seen)
        if n in (capture or ()):
            captured[n] = x
        self.lengths = positions + 1
        return x, captured

    def _layer(self, i: int, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               seen: torch.Tensor) -> torch.Tensor:
        """x [B, H] -> [B, H]: one decoder layer for one token per row, its keys and values written at each row's
        position."""
        rows, d = x.shape[0], self.head_dim
        q, k, v = self.weights.qkv(layer, x)  # [B, heads, d]
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)  # cos [B, 1, d] broadcasts over the heads
        batch = torch.arange(rows)
        self._k[i, batch, :, self.lengths], self._v[i, batch, :, self.lengths] = k, v
        width = seen.shape[1]
        keys, values = self._k[i, :, :, :width], self._v[i, :, :, :width]  # [B, Hkv, n, d]
        grouped = q.view(rows, keys.shape[1], -1, d)  # [B, Hkv, g, d]: query head h reads key head h // g
        scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * self.scaling  # [B, Hkv, g, n]
        scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)  # [B, Hkv, g, d]
        return self.weights.rest(layer, x, out.reshape(rows, -1))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, H] (the last layer's output) -> logits [R, V]: the final norm, then the output head (packed)."""
        head = self.model.get_output_embeddings()
        packed = packed_weight(head, head.weight) if self.weights.packed else None
        return pad2_linear(self.decoder.norm.forward(x), head.weight, packed=packed)


@dataclass
class Ended:
    """A prompt whose greedy answer ended (a stop token, or max_new_tokens), as `greedy_batch` yields it."""

    index: int  # which prompt
    new: list[int]  # its answer's tokens, a stop token included; the last one was never fed
    states: torch.Tensor | None  # [prompt + fed answer tokens, L, H] at the captured ids (None without capture)
    batch: FusedBatch  # whose row `row` holds its cache (prompt + fed tokens) until the generator goes on
    row: int


@torch.inference_mode()
def greedy_batch(model: nn.Module, prompts: list[list[int]], stops: set[int], max_new_tokens: int, *,
                 width: int | None = None, capture: list[int] | None = None,
                 dtype: torch.dtype | None = None) -> Iterator[Ended]:
    """Greedy answers to `prompts` on one `FusedBatch` of `width` rows (all prompts by default): each prompt prefilled
    alone into a row, then one step for every row at a time; yields each answer as it ends, and the next waiting
    prompt takes its row. With `capture`, the stream at those layer ids of every fed token, in `dtype`."""
    if not prompts:
        return
    width = min(width or len(prompts), len(prompts))
    batch = FusedBatch(model, width, max(len(p) for p in prompts) + min(max_new_tokens, FIRST_ANSWER_ROOM))
    states: list[list[torch.Tensor]] = [[] for _ in prompts]  # per prompt: [t, L, H] chunks, in order
    new: list[list[int]] = [[] for _ in prompts]
    rows = list(range(width))  # batch row j answers prompt rows[j]
    waiting = iter(range(width, len(prompts)))

    def start(j: int, b: int) -> None:  # prompt b alone into batch row j, its first answer token chosen
        out, captured = batch.prefill(j, torch.tensor(prompts[b]), capture or [])  # out [T_b, H]
        if capture:
            states[b].append(stacked_capture(captured, capture, dtype))  # [T_b, L, H]
        new[b].append(int(batch.logits(out[-1:])[0].argmax()))

    for j, b in enumerate(rows):
        start(j, b)
    while rows:
        ending = [j for j, b in enumerate(rows) if new[b][-1] in stops or len(new[b]) == max_new_tokens]
        if ending:
            for j in ending:
                yield Ended(rows[j], new[rows[j]], torch.cat(states[rows[j]]) if capture else None, batch, j)
                states[rows[j]] = []
            drop = []
            for j in ending:  # a waiting prompt takes the row; without one, the row leaves the batch
                b = next(waiting, None)
                if b is None:
                    drop.append(j)
                else:
                    rows[j] = b
                    start(j, b)
            if drop:
                keep = [j for j in range(len(rows)) if j not in drop]
                rows = [rows[j] for j in keep]
                if rows:
                    batch.keep(keep)
            continue  # a new row's first token may end its answer too
        out, captured = batch.step(torch.tensor([new[b][-1] for b in rows]), capture)  # out [B, H]
        hidden = stacked_capture(captured, capture, dtype) if capture else None  # [B, L, H]
        for j, (b, token) in enumerate(zip(rows, batch.logits(out).argmax(-1).tolist(), strict=True)):
            new[b].append(token)
            if capture:
                states[b].append(hidden[j: j + 1])


def stacked_capture(captured: dict[int, torch.Tensor], layer_ids: list[int],
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """Captured streams {id: [T, H]} -> [T, L, H] in ascending layer id order, in `dtype`."""
    return torch.stack([captured[i] for i in sorted(layer_ids)], dim=1).to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [heads, T, d] rotated as transformers' `apply_rotary_pos_emb` (halves, cos/sin [1, T, d]); also x [B, heads,
    d] with cos/sin [B, 1, d]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

