"""The DSpark draft: DFlash's block backbone with the anchor as the first prediction slot, a sequential (Markov)
correction head over the backbone's logits and a confidence head that estimates each slot's survival."""

# Tensor names match speculators 0.9.0 and vLLM 0.33's Qwen3 DSpark loader: the DFlash backbone's names, plus
# `markov_head.markov_w1.weight` [V, r] (indexed by the previous token in the target vocabulary),
# `markov_head.markov_w2.weight` [Vd, r], `markov_head.gate_proj.*` (gated) or `markov_head.joint_proj.*` (rnn),
# and `confidence_head.proj.{weight [1, H (+r)], bias [1]}`.
#
# Slot k of the block [anchor, MASK x (B-1)] drafts the token at anchor + k + 1 (k = 0..B-1), so a block drafts
# B tokens. With h_k the normed backbone output and U_k = head(h_k) its base logits:
#   logits_k = U_k + B(x_{k-1}, .)          x_{-1} = the anchor, x_{k-1} = the token drafted at slot k-1
#   vanilla: B = W2(W1[x])   gated: B = W2(sigmoid(G[h_k; W1[x]]) * W1[x])
#   rnn:     [g, c, o] = J[s; W1[x]; h_k], s <- sigmoid(g) s + (1 - sigmoid(g)) tanh(c), B = W2(tanh(o)), s_0 = 0
#   c_k = sigmoid(w . [h_k; W1[x_{k-1}]] / T_k)   (T_k: post-hoc per-slot temperatures, 1 until calibrated)
# Training feeds the data's tokens as x (teacher forcing); drafting feeds its own choices, left to right.
#
# Notation: N blocks, B block size, H hidden, r Markov rank, V target vocabulary, Vd draft vocabulary.

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.algos.dflash.model import DFlashDraft
from engine.algos.dspark.config import DSparkConfig


class MarkovHead(nn.Module):
    """The sequential correction B(x_{k-1}, .) added to the backbone's logits, one slot at a time."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int, hidden_size: int, kind: str):
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def initial_state(self, n: int, like: torch.Tensor) -> torch.Tensor | None:
        """s_0 = 0 [n, r] for the rnn head; the other heads keep no state."""
        return like.new_zeros(n, self.rank) if self.kind == "rnn" else None

    def step(self, e: torch.Tensor, h: torch.Tensor,
             state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot: e = W1[x_{k-1}] [n, r], h = h_k [n, H] -> (bias [n, Vd], next state)."""
        if self.kind == "vanilla":
            return self.markov_w2(e), state
        h = h.to(e.dtype)
        if self.kind == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([h, e], -1))) * e), state
        g, c, o = self.joint_proj(torch.cat([state, e, h], -1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        state = g * state + (1.0 - g) * torch.tanh(c)
        return self.markov_w2(torch.tanh(o)), state

    def block_bias(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Teacher-forced bias of whole blocks: e = W1[x_{k-1}] [N, B, r], h [N, B, H] -> [N, B, Vd]. The vanilla
        and gated heads keep no state, so every slot is one batched product; the rnn head runs slot by slot."""
        if self.kind != "rnn":
            return self.step(e, h, None)[0]
        state = self.initial_state(e.shape[0], e)
        biases = []
        for k in range(e.shape[1]):
            bias, state = self.step(e[:, k], h[:, k], state)
            biases.append(bias)
        return torch.stack(biases, 1)


class ConfidenceHead(nn.Module):
    """c_k's logit from [h_k; W1[x_{k-1}]] (or h_k alone): one linear layer."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class DSparkDraft(DFlashDraft):
    def __init__(self, cfg: DSparkConfig, embed_tokens: nn.Embedding, lm_head_weight: torch.Tensor | None = None):
        super().__init__(cfg, embed_tokens, lm_head_weight)
        h, r = self.hidden_size, cfg.markov_rank
        self.markov_head = (MarkovHead(cfg.vocab_size, cfg.draft_vocab_size or cfg.vocab_size, r, h,
                                       cfg.markov_head_type) if r > 0 else None)
        self.confidence_head = None
        if cfg.enable_confidence_head:
            with_markov = cfg.confidence_head_with_markov and r > 0
            self.confidence_head = ConfidenceHead(h + (r if with_markov else 0))
        temps = cfg.confidence_temperatures or [1.0] * cfg.block_size
        self.register_buffer("confidence_temperature", torch.tensor(temps, dtype=torch.float32), persistent=False)

    def cap(self, logits: torch.Tensor) -> torch.Tensor:
        """The logit soft-cap vLLM's logits processor applies to the head's logits and the Markov bias (none here)."""
        return logits

    @property
    def conf_with_markov(self) -> bool:
        return self.markov_head is not None and bool(self.config.confidence_head_with_markov)

    def slot(self, k: int, h: torch.Tensor, u: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Slot k for n blocks: h_k [n, H] normed backbone output, u = U_k [n, Vd], prev = x_{k-1} [n] (target ids)
        -> (corrected logits [n, Vd], confidence logit [n] or None (already divided by T_k), next Markov state)."""
        e = None
        if self.markov_head is not None:
            e = self.markov_head.markov_w1(prev)
            bias, state = self.markov_head.step(e, h, state)
            u = u + self.cap(bias).to(u.dtype)
        return u, self.confidence(h, e, self.confidence_temperature[k]), state

    def confidence(self, h: torch.Tensor, e: torch.Tensor | None, temperature: torch.Tensor) -> torch.Tensor | None:
        """Confidence logits c / T from h [.., H] and e = W1[x_{k-1}] [.., r] (or None without a Markov head);
        `temperature` broadcasts over h's leading dimensions (one slot's T_k, or [B] for whole blocks)."""
        if self.confidence_head is None:
            return None
        features = torch.cat([h, e.to(h.dtype)], -1) if self.conf_with_markov else h
        return self.confidence_head(features) / temperature.to(features.dtype)

    def heads(self, x: torch.Tensor, prev_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced heads over whole blocks: decoder output x [N, B, H], prev_ids [N, B] (x_{k-1} per slot)
        -> (corrected logits [N, B, Vd], confidence logits [N, B] or None); the same values as `slot` gives slot by
        slot, computed for all slots at once."""
        hn = self.norm(x)
        logits = self.project(hn)                                                  # [N, B, Vd]
        e = None
        if self.markov_head is not None:
            e = self.markov_head.markov_w1(prev_ids)                               # [N, B, r]
            logits = logits + self.cap(self.markov_head.block_bias(e, hn)).to(logits.dtype)
        return logits, self.confidence(hn, e, self.confidence_temperature[: x.shape[1]])   # [N, B, Vd], [N, B]

    def draft_sequentially(self, x: torch.Tensor, anchor_ids: torch.Tensor, steps: int,
                           choose: Callable[[torch.Tensor], torch.Tensor],
                           stop: Callable[[torch.Tensor], bool] | None = None
                           ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        """Left-to-right drafting of n blocks: x [n, B, H], anchor_ids [n] -> (draft ids [n, s], logits s x [n, Vd],
        confidence logits [n, s] or None), s <= steps. `choose(logits [n, Vd]) -> draft ids [n]` picks each token
        (argmax, or a sample); `stop(confidence logits so far [n, j])` may end the loop early (the static cut)."""
        hn = self.norm(x[:, :steps])
        base = self.project(hn)
        state = self.markov_head.initial_state(x.shape[0], hn) if self.markov_head is not None else None
        prev = anchor_ids
        tokens, logits, confs = [], [], []
        for k in range(steps):
            u, conf, state = self.slot(k, hn[:, k], base[:, k], prev, state)
            choice = choose(u)
            tokens.append(choice)
            logits.append(u)
            if conf is not None:
                confs.append(conf)
            prev = self.draft_to_target(choice)
            if stop is not None and confs and stop(torch.stack(confs, 1)):
                break
        return torch.stack(tokens, 1), logits, torch.stack(confs, 1) if confs else None

    def forward(self, aux, input_ids, position_ids, document_ids, anchors):  # the training entry point (DDP calls it)
        """-> (logits [N, B, Vd], confidence logits [N, B] or None); slot k drafts token anchor + k + 1, its
        previous token is the data's token at anchor + k."""
        x = self.anchored_hidden(aux, input_ids, position_ids, document_ids, anchors)
        t = input_ids.shape[1]
        prev_pos = (anchors[:, None] + torch.arange(self.block_size, device=anchors.device)[None, :]).clamp(max=t - 1)
        return self.heads(x, input_ids[0, prev_pos])
