"""The P-EAGLE draft: EAGLE-3's front end drafting a whole block in one forward (real slot + K-1 mask slots)."""

# It is an EAGLE-3 draft (`Eagle3Draft`: fused target features, the 2H-input first layer, `norm -> lm_head` over a
# draft vocabulary with d2t/t2d) plus two learned inputs of the parallel slots:
# - `mask_hidden` [1,1,A*Ht]: the "target feature" of every mask slot, inserted before `fc` (so it is fused like a
#   real one), as speculators 0.9.0 and vLLM 0.33 (`parallel_drafting`) name and read it;
# - the mask token's embedding row (`mask_embedding` [H] here, trainable; the rest of the table is the target's,
#   frozen). The checkpoint carries the whole table as `embed_tokens.weight` with that row in place, which vLLM
#   keeps as the draft's own (it only shares a table identical to the target's).
#
# Slot 1 of a block is EAGLE-3's step 0: emb(last token) + the target feature of the previous position. Slots 2..K
# are emb(MASK) + fc(mask_hidden) at the next positions. Attention is causal by depth: element (anchor a, depth d)
# sees the real rows r <= a of its document (within the window) and its own rollout (a, 1..d).
#
# Notation: T real rows of a packed sequence, M mask-slot elements, H hidden, Ht target hidden, A aux layers,
# Vd draft vocab, nh heads, hd head dim.

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.algos.common.layers import DraftCache, cached_attend, causal_mask, document_spans, repeat_kv
from engine.algos.eagle3.model import Eagle3Draft, masked_attention
from engine.algos.peagle.config import PEagleConfig


class PEagleDraft(Eagle3Draft):
    """EAGLE-3 draft + `mask_hidden` + a trainable mask-token embedding row; `embed_tokens` is frozen."""

    def __init__(self, cfg: PEagleConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(cfg, embed_tokens)
        self.embed_tokens.weight.requires_grad_(False)  # shared with the target; only the mask row trains
        self.mask_token_id = int(cfg.mask_token_id if cfg.mask_token_id is not None else 0)
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, self.fc.in_features))  # speculators: N(0, 1)
        self.mask_embedding = nn.Parameter(self.embed_tokens.weight[self.mask_token_id].detach().clone())  # [H]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; the mask token's row is the trainable `mask_embedding` (vLLM: a table lookup, so
        real occurrences of that token id read the same row)."""
        e = super().embed(input_ids)
        is_mask = (input_ids == self.mask_token_id).unsqueeze(-1)
        return torch.where(is_mask, self.mask_embedding.to(e.dtype), e)

    def slot_features(self, aux: torch.Tensor, masks: int) -> torch.Tensor:
        """aux [n, A*Ht] real features + `masks` mask slots -> fused hidden [1, n+masks, H]."""
        fill = self.mask_hidden.view(1, -1).to(aux.dtype).expand(masks, -1)
        return self.fuse(torch.cat([aux, fill]).unsqueeze(0))

    # -- inference: committed pairs + one block, with a KV cache --------------------------------------------------
    def block_cached(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                     cache: DraftCache, k: int) -> torch.Tensor:
        """input_ids [1,n] (new committed tokens, then k-1 mask tokens), hidden [1,n,H] (from `slot_features`),
        positions [1,n] -> logits [k, Vd] of the last k rows (draft j+1 from row n-k+j). The cache gets all n."""
        attend = cached_attend(cache, self.windows, self.kv_groups, input_ids.shape[1], input_ids.device)
        x = self._layers(input_ids, hidden, position_ids, attend)
        return self.head(x[:, -k:])[1][0]

    # -- training / evaluation: every sampled (anchor, depth) element in one masked forward ------------------------
    def parallel_forward(self, aux: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor,
                         document_ids: torch.Tensor, anchors: torch.Tensor, depths: torch.Tensor,
                         rows: torch.Tensor | None = None) -> torch.Tensor:
        """aux [1,T,A*Ht] features g_r, input_ids [1,T] tokens x_{r+1} (EAGLE-3's shift), position_ids and
        document_ids [1,T]; anchors/depths [M]: the mask-slot elements (depth >= 1), grouped by ascending depth,
        anchors ascending within a depth, each depth's anchors among the previous depth's (COD sampling)."""
        # Returns logits [1, T+M, Vd]: row r < T is depth 0 at anchor r (drafts x_{r+2}); row T+i is element i,
        # (anchor a, depth d), which drafts x_{a+d+2} (the target's prediction at row a+d). `rows` [K] (indices into
        # the T+M) limits the head to those rows: logits [1, K, Vd] (training needs only the elements in the loss).
        t, m = input_ids.shape[1], int(anchors.numel())
        ids = torch.cat([input_ids, input_ids.new_full((1, m), self.mask_token_id)], dim=1)       # [1, T+M]
        hidden = self.slot_features(aux[0], m)                                                     # [1, T+M, H]
        positions = torch.cat([position_ids, (position_ids[0, anchors] + depths).unsqueeze(0)], dim=1)
        attend = RolloutAttention(anchors, depths, document_ids, positions, self.windows, self.kv_groups, t)
        x = self._layers(ids, hidden, positions, attend)                                           # [1, T+M, H]
        return self.head(x if rows is None else x[:, rows])[1]

    def forward(self, aux, input_ids, position_ids, document_ids, anchors, depths, rows=None):  # training (DDP)
        return self.parallel_forward(aux, input_ids, position_ids, document_ids, anchors, depths, rows)

    def checkpoint_state(self, *, include_embeddings: bool = True) -> dict[str, torch.Tensor]:
        """The tensors vLLM loads: EAGLE-3's, `mask_hidden`, and `embed_tokens.weight` with the trained mask row."""
        out = super().checkpoint_state(include_embeddings=False)
        out.pop("mask_embedding")
        table = self.embed_tokens.weight.detach().clone()
        table[self.mask_token_id] = self.mask_embedding.detach().to(table.dtype)
        out["embed_tokens.weight"] = table
        return out


class RolloutAttention:
    """P-EAGLE's attention over [T real rows, M mask-slot elements], computed document by document and depth by
    depth, so no (T+M) x (T+M) mask is ever built.

    Depth 0 (the real rows) is causal attention within each document. Element (a, d) attends to the real rows
    r <= a of its document (the context: a [n_d, T_doc] mask) plus its own rollout (a, 1..d), which are "diagonal"
    keys gathered per query (EAGLE-3's `masked_attention`)."""

    def __init__(self, anchors: torch.Tensor, depths: torch.Tensor, document_ids: torch.Tensor,
                 positions: torch.Tensor, windows: list[int | None], kv_groups: int, t: int):
        self.windows, self.kv_groups = windows, kv_groups
        dev = anchors.device
        self.spans = document_spans(document_ids)
        self.causal = {w: [causal_mask(e - s, w, padding=False, device=dev) for s, e in self.spans]
                       for w in set(windows)}
        pos = positions[0]
        self.depth_rows: list[tuple[int, int, torch.Tensor]] = []  # (start, end) in the element axis, anchors
        self.rollout: list[list[torch.Tensor]] = []                  # depth d: element rows of (a, 1..d) per query
        start = t
        max_depth = int(depths.max()) if depths.numel() else 0
        for d in range(1, max_depth + 1):
            n = int((depths == d).sum())
            a = anchors[start - t: start - t + n]
            self.depth_rows.append((start, start + n, a))
            self.rollout.append([lo + torch.searchsorted(prev_a, a) for lo, _, prev_a in self.depth_rows])
            start += n
        self.context = {w: [self._context_parts(lo, a, d, w, pos) for d, (lo, _, a) in enumerate(self.depth_rows, 1)]
                        for w in set(windows)}

    def _context_parts(self, lo: int, a: torch.Tensor, d: int, window: int | None, pos: torch.Tensor) -> list[tuple]:
        """Depth d's queries (anchors `a`, element rows from `lo`) per document: (lo, i0:i1 the queries of that
        document, s:e its rows, context mask [1,1,n,T_doc]: rows r <= anchor, within the window of position a+d)."""
        parts = []
        for s, e in self.spans:
            i0, i1 = int(torch.searchsorted(a, s)), int(torch.searchsorted(a, e))
            if i1 == i0:
                continue
            rows = torch.arange(s, e, device=a.device)
            m = rows[None, :] <= a[i0:i1, None]
            if window:
                m = m & (pos[rows][None, :] > (pos[a[i0:i1]] + d)[:, None] - window)
            parts.append((lo, i0, i1, s, e, m[None, None]))
        return parts

    def __call__(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1,nh,T+M,hd], k/v [1,nkv,T+M,hd] -> [1,nh,T+M,hd]."""
        k, v = repeat_kv(k, self.kv_groups), repeat_kv(v, self.kv_groups)
        w = self.windows[i]
        outs = [F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], attn_mask=mask)
                for (s, e), mask in zip(self.spans, self.causal[w], strict=True)]
        for rollout, parts in zip(self.rollout, self.context[w], strict=True):
            for lo, i0, i1, s, e, mask in parts:
                diag = [(k[:, :, rows[i0:i1]], v[:, :, rows[i0:i1]]) for rows in rollout]  # (a, 1..d) per query
                outs.append(masked_attention(q[:, :, lo + i0: lo + i1], k[:, :, s:e], v[:, :, s:e], mask, diag))
        return torch.cat(outs, dim=2)
