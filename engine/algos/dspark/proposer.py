"""DSpark drafting: one backbone forward for the block, then left-to-right token choices through the Markov head,
and the static confidence cut, losslessly."""

# The block [last committed token, MASK x (B-1)] sits at positions q..q+B-1 over the committed context K/V (as
# DFlash's proposer keeps it); slot k drafts the token at q + k + 1. Each slot's token is chosen (argmax, or sampled
# from the corrected distribution q_k, which is returned for rejection sampling), and its confidence c_k read. The
# cut keeps the longest prefix whose survival prod_{i<=k} c_i stays >= the threshold. The decision uses only the
# draft's own quantities, known before the target sees the block: it only chooses how many tokens to propose, which
# speculative decoding's losslessness allows for any rule that does not look at the verification.

from __future__ import annotations

import torch

from engine.algos.dflash.proposer import DFlashProposer
from engine.algos.dspark.args import DSparkProposerOptions
from engine.algos.dspark.model import DSparkDraft
from engine.generate.proposers import Proposal
from engine.generate.sampling import SamplingParams, logits_to_probs


def confident_prefix(conf_logits: torch.Tensor, threshold: float) -> int:
    """conf_logits [s] (calibrated) -> the number of leading slots whose survival prod sigmoid stays >= threshold."""
    alive = torch.cumprod(torch.sigmoid(conf_logits.float()), 0) >= threshold
    return int(torch.cumprod(alive.long(), 0).sum())


class DSparkProposer(DFlashProposer):
    name = "dspark"

    def __init__(self, draft: DSparkDraft, **options):
        opts = DSparkProposerOptions(**options)
        super().__init__(draft, sample_drafts=opts.sample_drafts)
        self.threshold = opts.confidence_threshold
        self.last_survival: list[float] = []   # survival of each drafted slot in the last step (the cut's inputs)
        self.last_cut: int | None = None        # how many drafted tokens the cut kept (None: no confidence head)

    @torch.inference_mode()
    def propose(self, k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        k = min(k, self.draft.block_size)
        self.last_survival, self.last_cut = [], None
        if k < 1:
            return Proposal([])
        sampled = not params.greedy and self.sample_drafts
        draft_params = SamplingParams(temperature=params.temperature)
        probs: list[torch.Tensor] = []

        def choose(logits: torch.Tensor) -> torch.Tensor:          # [1, Vd] -> [1]
            if not sampled:
                return logits.argmax(-1)
            q = logits_to_probs(logits.float(), draft_params)
            probs.append(q[0])
            return torch.multinomial(q, 1, generator=generator).flatten()

        def stop(conf: torch.Tensor) -> bool:                        # [1, j]: the survival fell below the threshold
            return self.threshold > 0 and confident_prefix(conf[0], self.threshold) < conf.shape[1]

        anchor = torch.tensor([self.anchor], device=self.draft.fc.weight.device)
        tokens, _, conf = self.draft.draft_sequentially(self.block_hidden(), anchor, k, choose, stop)
        n = tokens.shape[1]
        if conf is not None:
            self.last_survival = torch.cumprod(torch.sigmoid(conf[0].float()), 0).tolist()
            n = confident_prefix(conf[0], self.threshold) if self.threshold > 0 else n
            self.last_cut = n
        drafts = self.draft.draft_to_target(tokens[0, :n]).tolist()
        cut = dict(withheld=tokens.shape[1] - n, confidence=self.last_survival or None)
        if not sampled:
            return Proposal(drafts, **cut)
        return Proposal(drafts, self._target_vocab_probs(probs[:n]), **cut)

    def _target_vocab_probs(self, probs: list[torch.Tensor]) -> torch.Tensor:
        """Draft-vocabulary distributions n x [Vd] -> [n, V] in the target vocabulary (zero outside the draft's)."""
        q = torch.zeros(len(probs), self.vocab_size)
        if probs:
            rows = torch.arange(probs[0].shape[-1], device=probs[0].device)
            q[:, self.draft.draft_to_target(rows).cpu()] = torch.stack(probs).cpu()
        return q
