"""The DFlash2 draft: DFlash's block backbone with grouped dynamic causal convolutions around every layer's attention
and MLP, and a low-rank candidate selector that rescores each slot's top-k given the token before it."""

# Tensor names match speculators 0.9.0 and vLLM 0.33's qwen3_dflash2 loader: DFlash's names, plus per layer
# `layers.{i}.{attention_conv,mlp_conv}.base_kernel` [2, taps, H] and `.kernel_projection.weight` [2*taps*G, H]
# (G = H / conv_group_size channel groups), and `candidate_selector.predecessor_codebook` [V, r],
# `candidate_selector.successor_codebook` [V, r], `candidate_selector.hidden_projection.weight` [r, H].
#
# Convolution, causal over the slots of a block (tap t reads slot i - t, zero before the block's first slot):
#   d = kernel_projection(y_in) -> [2, taps, G];  conv_s(y)_i = sum_t (base[s, t] + d[s, t, group(c)]) * y_{i-t}
#   layer: a = conv_0(norm(x)); x += conv_1(attn(a)); then the same around the MLP (identity at initialisation)
# Selector over the unary logits u_i = head(h_i), h_i = norm(x_i), candidates C_i = top-K of u_i:
#   s_i(p, c) = u_i[c] + < P[p] * W h_i , S[c] >       p the token before slot i, c in C_i
# Drafting walks left to right: p = the anchor, x_i = argmax_c s_i(p, c) (or a sample of softmax(s_i / T)), p = x_i.
#
# Notation: N blocks, B block size, H hidden, G groups, V vocabulary (DFlash2 drafts the full one), r rank, K top-k.

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.algos.common.layers import Attend, DecoderLayer, LayerDims
from engine.algos.dflash.model import DFlashDraft
from engine.algos.dflash2.config import DFlash2Config


def grouped_causal_conv(y: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """y [.., T, H] (T whole blocks), delta [.., T, taps, G], base [taps, H] -> [.., T, H]: slot i of each block
    gets sum_t (base[t] + delta_i[t, group]) * y_{i-t}, the taps before the block's first slot reading zero."""
    taps, groups = base.shape[0], delta.shape[-1]
    blocks = y.reshape(-1, block_size, groups, y.shape[-1] // groups)          # [n, B, G, g]
    d = delta.reshape(-1, block_size, taps, groups)                            # [n, B, taps, G]
    out = torch.zeros_like(blocks)
    for tap in range(min(taps, block_size)):
        shifted = F.pad(blocks, (0, 0, 0, 0, tap, 0))[:, :block_size]          # y_{i-tap}
        out = out + (base[tap].view(groups, -1) + d[:, :, tap, :, None]) * shifted
    return out.reshape(y.shape)


class GroupedDynamicConv(nn.Module):
    """The input-side and output-side convolutions of one sublayer, their kernels read from the sublayer's input."""

    def __init__(self, hidden: int, taps: int, group_size: int, block_size: int):
        super().__init__()
        self.taps, self.groups, self.block_size = taps, hidden // group_size, block_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)
        self.reset_identity()

    def reset_identity(self) -> None:
        """Both convolutions the identity (speculators' start: the layer is then DFlash's)."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0].fill_(1.0)
            self.kernel_projection.weight.zero_()

    def prepare(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sublayer input y [.., T, H] -> (convolved input, the output side's kernel deltas [.., T, taps, G])."""
        d = self.kernel_projection(y).unflatten(-1, (2, self.taps, self.groups))
        return grouped_causal_conv(y, d[..., 0, :, :], self.base_kernel[0], self.block_size), d[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Sublayer output y [.., T, H] convolved with the kernel `prepare` returned."""
        return grouped_causal_conv(y, delta, self.base_kernel[1], self.block_size)


class ConvDecoderLayer(DecoderLayer):
    """A Qwen3 decoder layer whose attention and MLP are each wrapped in a grouped dynamic causal convolution."""

    def __init__(self, dims: LayerDims, index: int, *, taps: int, group_size: int, block_size: int):
        super().__init__(dims, index)
        self.attention_conv = GroupedDynamicConv(dims.hidden, taps, group_size, block_size)
        self.mlp_conv = GroupedDynamicConv(dims.hidden, taps, group_size, block_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        a, delta = self.attention_conv.prepare(self.input_layernorm(x))
        q, k, v = self.self_attn.qkv(a, cos, sin)
        x = x + self.attention_conv.finish(self.self_attn.out(attend(self.index, q, k, v)), delta)
        m, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(m), delta)


class CandidateSelector(nn.Module):
    """s(p, c) = u[c] + <P[p] * W h, S[c]>: the unary logit of candidate c plus a rank-r bilinear transition score."""

    def __init__(self, vocab_size: int, hidden: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def scores(self, unary: torch.Tensor, hn: torch.Tensor, prev: torch.Tensor,
               candidates: torch.Tensor) -> torch.Tensor:
        """unary [.., V], hn [.., H] (normed), prev [..] (token ids), candidates [.., K] -> scores [.., K]."""
        context = self.predecessor_codebook[prev] * self.hidden_projection(hn).to(self.predecessor_codebook.dtype)
        edges = (context.unsqueeze(-2) * self.successor_codebook[candidates]).sum(-1)        # [.., K]
        return unary.gather(-1, candidates) + edges.to(unary.dtype)


def training_candidates(candidates: torch.Tensor, targets: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unary top-K [.., K] and hard targets [..] -> (candidates with a missing target put in the last slot, the
    target's slot [..], whether the unary top-K held it [..]): speculators' K-way training set."""
    k = candidates.shape[-1]
    match = candidates == targets.unsqueeze(-1)
    contains = match.any(-1)
    where = torch.where(contains, match.long().argmax(-1), torch.full_like(targets, k - 1))
    out = candidates.clone()
    out[..., -1] = torch.where(contains, out[..., -1], targets)
    return out, where, contains


class DFlash2Draft(DFlashDraft):
    def __init__(self, cfg: DFlash2Config, embed_tokens: nn.Embedding, lm_head_weight: torch.Tensor | None = None):
        super().__init__(cfg, embed_tokens, lm_head_weight)
        self.top_k = min(cfg.selector_top_k, cfg.vocab_size)
        self.candidate_selector = CandidateSelector(cfg.vocab_size, self.hidden_size, cfg.selector_rank)

    def make_layer(self, dims: LayerDims, index: int) -> ConvDecoderLayer:
        cfg = self.config
        return ConvDecoderLayer(dims, index, taps=cfg.conv_kernel_size, group_size=cfg.conv_group_size,
                                block_size=cfg.block_size)

    def reset_convolutions(self) -> None:
        for layer in self.layers:
            layer.attention_conv.reset_identity()
            layer.mlp_conv.reset_identity()

    def walk(self, hn: torch.Tensor, anchor_ids: torch.Tensor, choose: Callable[[torch.Tensor], torch.Tensor]
             ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """Left-to-right drafting of n blocks: hn [n, s, H] normed slot outputs, anchor_ids [n] -> (drafts [n, s],
        s x scores [n, K], candidates [n, s, K]); `choose(scores [n, K]) -> [n]` picks a candidate (argmax or a
        sample), whose token is the next slot's predecessor."""
        unary = self.project(hn)                                                   # [n, s, V]
        candidates = unary.topk(self.top_k, dim=-1).indices                        # [n, s, K]
        prev, tokens, scores = anchor_ids, [], []
        for i in range(hn.shape[1]):
            s = self.candidate_selector.scores(unary[:, i], hn[:, i], prev, candidates[:, i])
            prev = candidates[:, i].gather(-1, choose(s)[:, None]).squeeze(-1)
            tokens.append(prev)
            scores.append(s)
        return torch.stack(tokens, 1), scores, candidates

    def greedy_drafts(self, x: torch.Tensor, anchor_ids: torch.Tensor) -> torch.Tensor:
        return self.walk(self.norm(x), anchor_ids, lambda s: s.argmax(-1))[0]

    def forward(self, aux, input_ids, position_ids, document_ids, anchors, selector_targets=None):
        """The training entry point (DDP calls it) -> unary logits [N, B-1, V] of the drafted slots 1..B-1 (slot 0
        is the anchor); with `selector_targets` [N, B-1] (the hard target of each drafted slot) also (candidates
        [N, B-1, K], their teacher-forced scores [N, B-1, K], the target's candidate slot [N, B-1], whether the
        unary top-K held the target [N, B-1]). Slot i's predecessor is the data's token at anchor + i - 1."""
        hn = self.norm(self.anchored_hidden(aux, input_ids, position_ids, document_ids, anchors)[:, 1:])
        logits = self.project(hn)
        if selector_targets is None:
            return logits
        slots = torch.arange(self.block_size - 1, device=anchors.device)  # slot i + 1 reads the token at anchor + i
        prev = input_ids[0, (anchors[:, None] + slots[None, :]).clamp(max=input_ids.shape[1] - 1)]
        candidates, where, contains = training_candidates(logits.detach().topk(self.top_k, dim=-1).indices,
                                                          selector_targets)
        scores = self.candidate_selector.scores(logits, hn, prev, candidates)
        return logits, candidates, scores, where, contains
