"""The DFlash draft: a block [anchor, MASK x (B-1)] denoised in one forward, target features as extra keys/values."""

# Tensor names match speculators 0.9.0 and vLLM 0.33's DFlash loader (`fc`, `hidden_norm`, `layers.{i}.*` Qwen3
# layers with q/k norms, `norm`, and `lm_head` + `d2t`/`t2d` only for a reduced draft vocabulary). The target's
# embedding (and its lm_head for the full vocabulary) are shared and frozen, never saved.
#
# Context c = hidden_norm(fc(g)) over the target features g of the committed positions, computed once and
# projected into every layer's keys and values by that layer's own k/v projections; queries come from the block
# only. A block's slots see the context strictly before the anchor (same document, within the window) and their
# own block (bidirectionally, or causally when the layer is causal in the block).
#
# Notation: T context positions, N blocks, B block size, H hidden, Ht target hidden, A aux layers.

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from engine.algos.common.layers import (
    DecoderLayer,
    LayerDims,
    RMSNorm,
    document_spans,
    layer_windows,
    repeat_kv,
    rotary_embedding,
)
from engine.algos.dflash.config import DFlashConfig


def document_groups(document_ids: torch.Tensor, anchors: torch.Tensor,
                    block_size: int) -> list[tuple[int, int, int, int]] | None:
    """document_ids [1, T], anchors [N] ascending -> per document holding anchors: (first slot, end slot, first
    row, end row) of its blocks' slots and of its rows (a block sees only its own document). None when the
    anchors are not ascending (then the slots of a document are not contiguous: one dense group)."""
    if anchors.numel() == 0 or bool((anchors[1:] < anchors[:-1]).any()):
        return None
    spans = document_spans(document_ids)
    bounds = torch.tensor([s for s, _ in spans] + [spans[-1][1]], device=anchors.device)
    first = torch.searchsorted(anchors.contiguous(), bounds).tolist()  # first anchor at or after each boundary
    return [(lo * block_size, hi * block_size, s, e)
            for (s, e), lo, hi in zip(spans, first[:-1], first[1:], strict=True) if hi > lo]


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DFlashConfig, embed_tokens: nn.Embedding, lm_head_weight: torch.Tensor | None = None):
        super().__init__()
        self.config = cfg
        tlc = cfg.transformer_layer_config
        dims = LayerDims.from_config({**tlc, "model_type": "qwen3"})  # vLLM builds Qwen3 layers (q/k norms)
        self.hidden_size = h = dims.hidden
        ids = cfg.aux_hidden_state_layer_ids or []
        self.num_aux = len(ids) if ids else cfg.num_layers
        ht = cfg.target_hidden_size or h
        self.fc = nn.Linear(self.num_aux * ht, h, bias=False)
        self.hidden_norm = RMSNorm(h, dims.eps)
        self.layers = nn.ModuleList([self.make_layer(dims, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(h, dims.eps)
        if cfg.reduced_vocab:
            self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        else:  # the target's own head over the full vocabulary: shared, frozen, not a parameter of the draft
            self.lm_head = None
            self.register_buffer("target_head", lm_head_weight.detach() if lm_head_weight is not None
                                 else torch.zeros(cfg.vocab_size, h), persistent=False)
            self.d2t = self.t2d = None
        self.embed_tokens = embed_tokens
        self.embed_tokens.weight.requires_grad_(False)
        self.rotary_emb = self.make_rotary(tlc)
        self.windows = layer_windows(tlc, cfg.num_layers)
        # speculators' rule: full-attention layers are bidirectional in the block; sliding ones unless told
        # otherwise (vLLM applies `not sliding_window_non_causal` to every layer; our drafts make both agree)
        self.block_causal = [w is not None and not cfg.sliding_window_non_causal for w in self.windows]
        self.kv_groups = dims.heads // dims.kv_heads
        self.mask_token_id = int(cfg.mask_token_id if cfg.mask_token_id is not None else 0)

    def make_layer(self, dims: LayerDims, index: int) -> DecoderLayer:
        """Decoder layer `index` (a family member's own layer, e.g. DFlash2's with convolutions; `self.config` is
        set when this runs)."""
        return DecoderLayer(dims, index)

    def make_rotary(self, tlc: dict) -> nn.Module:
        """The layers' RoPE (cos, sin) from the layer config (a family member may bring its own)."""
        return rotary_embedding(tlc)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Block token ids [..] -> the decoder's input [.., H]: the target's plain embedding, frozen."""
        with torch.no_grad():
            return self.embed_tokens(ids).to(self.fc.weight.dtype)

    @staticmethod
    def shared_copies() -> set[str]:
        """Checkpoint tensors that copy the target's (loaded from the target, not the file)."""
        return set()

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Decoder output [.., H] -> draft-vocabulary logits [.., Vd]."""
        return self.project(self.norm(x))

    def project(self, hn: torch.Tensor) -> torch.Tensor:
        """Normed decoder output [.., H] -> draft-vocabulary logits [.., Vd] (own head, or the target's)."""
        return self.lm_head(hn) if self.lm_head is not None else F.linear(hn, self.target_head.to(hn.dtype))

    def greedy_drafts(self, x: torch.Tensor, anchor_ids: torch.Tensor) -> torch.Tensor:
        """Decoder output of the drafting slots of n blocks [n, s, H] and their anchor tokens [n] -> the greedy
        drafts [n, s] (target ids). The proposer and the evaluator both draft through this (DFlash2 overrides it
        with its candidate selector's walk)."""
        return self.draft_to_target(self.logits(x).argmax(-1))

    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """Target features [.., T, A*Ht] (ascending layer order) -> c [.., T, H]."""
        return self.hidden_norm(self.fc(aux))

    def context_kv(self, c: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """c [1,T,H], positions [1,T] -> per layer (k, v) [1,nkv,T,hd] of the context rows (RoPE applied)."""
        cos, sin = self.rotary_emb(c, positions)
        return [layer.self_attn.kv(c, cos, sin) for layer in self.layers]

    def block_forward(self, block_ids: torch.Tensor, block_positions: torch.Tensor,
                      ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], ctx_mask: torch.Tensor,
                      groups: list[tuple[int, int, int, int]] | None = None) -> torch.Tensor:
        """Blocks in one forward. block_ids/positions [1, N*B]; ctx_kv from `context_kv`; ctx_mask [N*B, T] (bool,
        which context rows each slot sees; its own block is added here) -> decoder output [1, N*B, H]."""
        # `groups` (from `document_groups`): (first slot, end slot, first row, end row) of slots that see only those
        # context rows and each other's blocks, e.g. one document of a packed row. Attention then runs group by
        # group and never computes the masked-out pairs between documents; the result is the same.
        n_slots = block_ids.shape[1]
        b = self.block_size
        x = self.embed(block_ids)
        cos, sin = self.rotary_emb(x, block_positions)
        groups = groups or [(0, n_slots, 0, ctx_mask.shape[1])]
        blk = torch.arange(n_slots, device=block_ids.device) // b
        slot = torch.arange(n_slots, device=block_ids.device) % b
        masks = {}  # per causal flag, per group: [1, 1, slots, rows + slots]
        for causal in set(self.block_causal):
            masks[causal] = []
            for s0, s1, c0, c1 in groups:
                same_block = blk[s0:s1, None] == blk[None, s0:s1]
                own = same_block & (slot[None, s0:s1] <= slot[s0:s1, None]) if causal else same_block
                masks[causal].append(torch.cat([ctx_mask[s0:s1, c0:c1], own], dim=1)[None, None])

        # split (not index) the rows and slots into the groups' pieces: the backward of a split writes each piece's
        # gradient into one buffer, where every slice would allocate and add a full-size zero gradient
        row_cuts = sorted({0, ctx_mask.shape[1]} | {c for g in groups for c in g[2:]})
        row_sizes = [hi - lo for lo, hi in pairwise(row_cuts)]
        row_piece = [row_cuts.index(c0) for _, _, c0, _ in groups]
        slot_sizes = [s1 - s0 for s0, s1, _, _ in groups]  # the groups cover the slots in order

        def attend(i, q, k, v):
            k_ctx, v_ctx = (t.split(row_sizes, dim=2) for t in ctx_kv[i])
            outs = []
            pieces = zip(q.split(slot_sizes, dim=2), k.split(slot_sizes, dim=2), v.split(slot_sizes, dim=2),
                         masks[self.block_causal[i]], strict=True)
            for g, (q_g, k_g, v_g, mask) in enumerate(pieces):
                keys = repeat_kv(torch.cat([k_ctx[row_piece[g]], k_g], dim=2), self.kv_groups)
                values = repeat_kv(torch.cat([v_ctx[row_piece[g]], v_g], dim=2), self.kv_groups)
                outs.append(F.scaled_dot_product_attention(q_g, keys, values, attn_mask=mask))
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

        for layer in self.layers:
            x = layer(x, cos, sin, attend)
        return x

    # -- training / evaluation: blocks at chosen anchors of packed rows -------------------------------------------
    def anchored_blocks(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                        document_ids: torch.Tensor, anchors: torch.Tensor,
                        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """aux [1,T,A*Ht], input_ids/position_ids/document_ids [1,T], anchors [N] (indices into the row) ->
        logits [N, B, Vd]; slot i of block j drafts the token at anchors[j] + i (slot 0 is the anchor itself).

        `ctx_kv` (from `context_kv`) may be passed when several calls share one row."""
        return self.logits(self.anchored_hidden(aux, input_ids, position_ids, document_ids, anchors, ctx_kv))

    def anchored_hidden(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                        document_ids: torch.Tensor, anchors: torch.Tensor,
                        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """As `anchored_blocks`, but the decoder output [N, B, H] before the final norm and the head."""
        b = self.block_size
        n = int(anchors.numel())
        dev = input_ids.device
        if ctx_kv is None:
            ctx_kv = self.context_kv(self.context(aux), position_ids)
        block_ids = torch.full((n, b), self.mask_token_id, dtype=torch.long, device=dev)
        block_ids[:, 0] = input_ids[0, anchors]
        block_pos = position_ids[0, anchors][:, None] + torch.arange(b, device=dev)[None, :]  # [N, B]
        t = input_ids.shape[1]
        idx = torch.arange(t, device=dev)
        ctx_mask = (idx[None, :] < anchors[:, None]) & (document_ids[0][None, :] == document_ids[0, anchors][:, None])
        window = next((w for w in self.windows if w), None)
        if window:
            ctx_mask = ctx_mask & (idx[None, :] >= anchors[:, None] - window)
        ctx_mask = ctx_mask.repeat_interleave(b, dim=0)  # [N*B, T]
        x = self.block_forward(block_ids.view(1, -1), block_pos.view(1, -1), ctx_kv, ctx_mask,
                               document_groups(document_ids, anchors, b))
        return x.view(n, b, -1)

    def forward(self, aux, input_ids, position_ids, document_ids, anchors):  # the training entry point (DDP calls it)
        """-> logits [N, B-1, Vd] of the drafted slots 1..B-1 (slot 0 is the anchor: it never counts in the loss, so
        its head product, 1/B of the largest one, is not computed)."""
        return self.logits(self.anchored_hidden(aux, input_ids, position_ids, document_ids, anchors)[:, 1:])

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Exactly the tensors vLLM loads (no shared embedding, target head or rotary buffers)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith(("embed_tokens.", "rotary_emb.", "target_head"))}
