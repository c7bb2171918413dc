"""speculators 0.9.0 beside our EAGLE-3 model: load a draft folder in both and compare the logits of each
training-time-test step on the same random inputs."""

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
    """Max |their logits - ours| per training-time-test step, on random aux states and token ids ([1, T, 3H], [1, T])."""
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
