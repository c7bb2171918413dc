"""Drafts for the built-in target made without training: random EAGLE-3 weights in vLLM's layout, and a P-EAGLE
draft whose first slot is a trained EAGLE-3 draft's step 0."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.algos import ALGOS

VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"


def random_eagle3_draft(folder: Path, *, mutate=None, seed: int = 0) -> Path:
    """A random-weight EAGLE-3 draft for the built-in target with exactly vLLM's tensor names (bf16)."""
    import engine.algos  # noqa: F401  (registers the speculators config types)
    from engine.format import vllm_rules as vr
    from engine.format.checkpoint import read_config_dict, save_checkpoint
    from engine.format.config import build_draft_config
    from engine.targets.resolve import resolve_target

    verifier = read_config_dict(resolve_target("smollm2-135m-instruct").path)
    cfg = build_draft_config("eagle3", verifier_config=verifier, verifier_name=VERIFIER, draft_vocab_size=8192,
                             eagle_aux_hidden_state_layer_ids=[2, 15, 27], norm_before_fc=True,
                             norm_before_residual=True, norm_output=True)
    hf = vr.extract_transformers_pre_trained_config(cfg.to_dict())
    expected, optional = vr.expected_parameters(cfg.to_dict(), hf)
    gen = torch.Generator().manual_seed(seed)
    state = {name: (torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=gen) * 0.02)
             for name, shape in expected.items() if name not in optional or name == "lm_head.weight"}
    vocab, dvocab = int(hf["vocab_size"]), int(hf["draft_vocab_size"])
    selected = torch.sort(torch.randperm(vocab, generator=gen)[:dvocab]).values
    state["d2t"] = selected - torch.arange(dvocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[selected] = True
    state["t2d"] = t2d
    if mutate:
        mutate(state)
    return save_checkpoint(folder, cfg, state, dtype=torch.bfloat16)


def peagle_from_eagle3(eagle3_dir: Path, target, speculative_tokens: int):
    """A P-EAGLE draft whose slot 1 is the shipped EAGLE-3 draft's step 0 (its layer, fc, norms, head and draft
    vocabulary; P-EAGLE's first slot is EAGLE-3's step 0): accepted like it at position 1, with untrained mask
    slots after it. Drafts that get accepted exercise the accept and rollback paths."""
    from engine.algos.common.vocab import choose_mask_token
    from engine.algos.peagle.model import PEagleDraft
    from engine.format.config import parse_draft_config

    eagle3 = ALGOS.get("eagle3").load(eagle3_dir, target)
    cfg = eagle3.config.to_dict()
    cfg.update(speculators_model_type="peagle", architectures=["PEagleSpeculator"], embed_requires_grad=True,
               auto_map={"": "config.PEagleSpeculatorConfig"}, mask_token_id=choose_mask_token(target))
    cfg["speculators_config"]["algorithm"] = "peagle"
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = speculative_tokens
    torch.manual_seed(0)
    draft = PEagleDraft(parse_draft_config(cfg), embed_tokens=target.embed_tokens())
    state = {k: v for k, v in eagle3.state_dict().items() if not k.startswith(("embed_tokens.", "rotary_emb."))}
    assert not [k for k in draft.load_state_dict(state, strict=False).unexpected_keys]
    return draft.eval()
