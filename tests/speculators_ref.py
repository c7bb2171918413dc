"""speculators 0.9.0 beside our EAGLE-3 model: load a draft folder in both, compare the logits of each
training-time-test step on the same random inputs, and count acceptance from speculators' logits."""

from __future__ import annotations

from pathlib import Path

import torch


def load_reference(folder: Path, *, verifier_path: str | None = None):
    """speculators' own model of a draft folder (fp32, eager attention: no flex attention on a CPU); `verifier_path`
    points it at a local copy of the verifier when the config's hub id is not on this offline machine."""
    from speculators import SpeculatorModel
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    cfg = Eagle3SpeculatorConfig.from_pretrained(folder)
    cfg.transformer_layer_config._attn_implementation = "eager"
    if verifier_path is not None:
        cfg.speculators_config.verifier.name_or_path = verifier_path
    torch.manual_seed(0)
    return SpeculatorModel.from_pretrained(folder, config=cfg, dtype=torch.float32).eval()


def logit_gaps(ref, ours, vocab_size: int, *, tokens: int, steps: int) -> list[float]:
    """Max |their logits - ours| per training-time-test step, on random aux states and token ids
    ([1, T, 3H], [1, T])."""
    torch.manual_seed(1)
    aux = torch.randn(1, tokens, ours.fc.in_features)
    ids = torch.randint(3, vocab_size, (1, tokens))
    doc, pos = torch.zeros(1, tokens, dtype=torch.long), 1 + torch.arange(tokens)[None]
    theirs: list[torch.Tensor] = []
    hook = ref.lm_head.register_forward_hook(lambda m, i, o: theirs.append(o.detach().float()))
    with torch.no_grad():
        ref(hidden_states=aux, input_ids=ids, document_ids=doc, position_ids=pos, ttt_steps=steps)
        mine = ours.ttt_forward(aux, ids, pos, doc, steps)
    hook.remove()
    assert len(theirs) == steps
    return [float((theirs[k] - mine[k].float()).abs().max()) for k in range(steps)]


@torch.no_grad()
def reference_step_logits(ref, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> list[torch.Tensor]:
    """k x [T-1, Vd]: speculators' training-time-test logits over a held-out sequence, aligned as our
    `engine.algos.eagle3.evaluate.step_logits` aligns ours (aux [T, A*Ht], token_ids [T])."""
    t = int(token_ids.shape[0])
    ids = token_ids.long().view(1, -1)[:, 1:]                      # [1, T-1]: x_1..x_{T-1}
    g = aux[:-1].float().unsqueeze(0)                                # [1, T-1, A*Ht]: g_0..g_{T-2}
    steps: list[torch.Tensor] = []
    hook = ref.lm_head.register_forward_hook(lambda m, i, o: steps.append(o.detach().float()[0]))
    try:
        ref(hidden_states=g, input_ids=ids, document_ids=torch.zeros_like(ids),
            position_ids=torch.arange(1, t).view(1, -1), ttt_steps=k)
    finally:
        hook.remove()
    return steps


class ReferenceEagle3:
    """Our registered EAGLE-3 algorithm with speculators' model computing the draft logits: `evaluate_samples`
    then gives the acceptance that speculators' draft reaches on the same held-out samples."""

    def __init__(self, algorithm, ref):
        self._algorithm, self._ref = algorithm, ref

    def __getattr__(self, name: str):
        return getattr(self._algorithm, name)

    def acceptance_counts(self, draft, aux: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
        from engine.algos.eagle3.evaluate import counts_from_steps

        ids = token_ids.long().cpu()
        return counts_from_steps(draft, reference_step_logits(self._ref, aux, ids, k), ids)

    def walk_counts(self, draft, aux: torch.Tensor, token_ids: torch.Tensor, k: int, p_min=None):
        return self.acceptance_counts(draft, aux, token_ids, k), None  # a chain draft has no cut


def load_block_reference(folder: Path, config_class, target, *, lm_head: bool = False):
    """speculators' model of a DFlash-family draft folder (eager attention), with the verifier-owned weights our
    checkpoint does not carry copied from `target`: its embedding, and its lm_head when `lm_head`."""
    from speculators import SpeculatorModel

    cfg = config_class.from_pretrained(folder)
    cfg.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
    ref = SpeculatorModel.from_pretrained(folder, config=cfg).eval()
    with torch.no_grad():
        ref.embed_tokens.weight.copy_(target.embed_tokens().weight)
        if lm_head:
            ref.lm_head.weight.copy_(target.lm_head().weight)
    return ref


def saved_and_built_shapes(folder: Path, draft_class) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(the tensors speculators 0.9.0's fixture `folder` marks `saved` in state_dict.tsv, the checkpoint tensors of
    our `draft_class` built from its config.json on the meta device), each {name: shape}."""
    import csv
    import json

    from torch import nn

    from engine.format.config import parse_draft_config

    cfg = parse_draft_config(json.loads((folder / "config.json").read_text()))
    with torch.device("meta"):
        draft = draft_class(cfg, embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size))
    rows = list(csv.reader((folder / "state_dict.tsv").read_text().splitlines(), delimiter="\t"))
    saved = {name: json.loads(shape) for name, shape, _, kept in rows if kept == "saved"}
    return saved, {name: list(t.shape) for name, t in draft.checkpoint_state().items()}
