"""The toy head's torch side: model, batches (g_t -> x_{t+2}), cross-entropy objective, one-token proposer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.format.config import ProposalMethod, SpeculatorsInfo, VerifierInfo
from engine.generate.proposers import Proposal, Proposer
from . import ToyConfig


class ToyHead(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.config = cfg
        self.head = nn.Linear(len(cfg.aux_hidden_state_layer_ids) * cfg.target_hidden_size, cfg.vocab_size)

    def forward(self, aux: torch.Tensor) -> torch.Tensor:  # [.., A*H] -> [.., V]
        return self.head(aux)


def build(target, aux: list[int], args, seed: int) -> ToyHead:
    h, v = target.hidden_size, target.vocab_size
    cfg = ToyConfig(
        speculators_config=SpeculatorsInfo(algorithm="toy", proposal_methods=[ProposalMethod(speculative_tokens=1)],
                                           verifier=VerifierInfo(name_or_path=target.verifier_name)),
        transformer_layer_config={"hidden_size": h, "vocab_size": v, "num_attention_heads": 1,
                                  "intermediate_size": h, "model_type": "llama"},
        aux_hidden_state_layer_ids=aux, target_hidden_size=h, draft_vocab_size=v)
    torch.manual_seed(seed)
    draft = ToyHead(cfg)
    nn.init.normal_(draft.head.weight, std=args.toy_init_std)
    nn.init.zeros_(draft.head.bias)
    return draft


def load(path) -> ToyHead:
    from engine.format.checkpoint import load_state_dict, read_config_dict

    draft = ToyHead(ToyConfig.model_validate(read_config_dict(path)))
    draft.load_state_dict({k: v.float() for k, v in load_state_dict(path).items()})
    return draft.eval()


def collate(samples, layout, max_tokens):
    aux, labels, mask = [], [], []
    for s in samples:
        t = int(s["token_ids"].shape[0])
        if t < 3:
            continue
        aux.append(s["hidden_states"][: t - 2, layout.aux_columns].flatten(1).float())  # g_0..g_{t-3}
        labels.append(s["token_ids"][2:t].long())                                        # x_2..x_{t-1}
        mask.append(s["loss_mask"][2:t].bool())
    return {"aux": torch.cat(aux)[None], "labels": torch.cat(labels)[None], "loss_mask": torch.cat(mask)[None]}


@torch.inference_mode()
def acceptance_counts(draft: ToyHead, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """a[q] = 1 when the head over g_{q-1} (the proposer's state once x_q is committed) predicts x_{q+1}."""
    t = int(token_ids.shape[0])
    a = torch.zeros(t, dtype=torch.int64)
    if k >= 1 and t >= 3:
        guess = draft(aux[: t - 2].float()).argmax(-1)                   # from g_0..g_{t-3}: x_2..x_{t-1}
        a[1: t - 1] = (guess == token_ids[2:t].long()).long()
    return a


class ToyObjective:
    def __call__(self, model, batch):
        logits = model(batch["aux"])
        mask = batch["loss_mask"]
        ce = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="none").view_as(mask)
        loss = (ce * mask).sum() / mask.sum().clamp(min=1)
        hits = ((logits.argmax(-1) == batch["labels"]) & mask).sum()
        return loss, {"acc_sum": float(hits), "acc_total": float(mask.sum())}

    def summarize(self, stats):
        acc = stats.get("acc_sum", 0.0) / max(stats.get("acc_total", 0.0), 1.0)
        return {"full_acc_0": acc, "est_acceptance_length": 1.0 + acc}


class ToyProposer(Proposer):
    name = "toy"

    def __init__(self, draft: ToyHead):
        self.draft = draft
        self.aux_layer_ids = list(draft.config.aux_hidden_state_layer_ids)
        self.last = None

    def start(self, prompt_ids, prompt_aux, first_token):
        self.last = prompt_aux[-1]  # the state whose next token is `first_token`: it predicts the one after

    @torch.inference_mode()
    def propose(self, k, params, generator):
        if k < 1:
            return Proposal([])
        return Proposal([int(self.draft(self.last.float()).argmax())])

    def update(self, accepted, next_token, aux):
        self.last = aux[-1]
