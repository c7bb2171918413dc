"""DFlash's own behaviour (what every algorithm shares is in tests/engine/test_algorithm_behaviour.py): decoding =
training blocks, training, checkpoints vLLM's rules accept, parity with speculators 0.9.0's DFlashDraftModel."""

from __future__ import annotations

import pytest
import torch

from engine.algos import ALGOS
from engine.algos.dflash.args import DFlashArgs
from engine.algos.dflash.io import build_dflash, load_dflash
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from testkit.decoding import PROMPTS  # the decode engine's own prompts


@pytest.fixture(scope="module")
def tiny(tiny_targets):
    """A private copy of the tiny target: DFlash drafts share (and freeze) its embedding."""
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["llama"]))


@pytest.fixture(scope="module")
def tiny_dflash(tiny):
    counts = torch.arange(tiny.vocab_size).flip(0)  # reduced vocabulary: exercises d2t
    return build_dflash(tiny, DFlashArgs(num_layers=2, block_size=4, draft_vocab_size=160),
                        aux_layer_ids=[1, 2, 3], token_counts=counts).eval()


def proposer(draft):
    return ALGOS.get("dflash").proposer(draft)


def test_proposer_block_equals_the_training_block(tiny, tiny_dflash):
    """The cached decoding path (committed context K/V + one block) computes the batched training block."""
    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = proposer(tiny_dflash)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    logits, aux = runner.forward(ids, all_logits=False)
    first = int(logits[-1].argmax())
    prop.start(ids, aux, first)
    drafted = prop.propose(3, SamplingParams(), None).tokens
    seq = torch.tensor(ids + [first])
    full_aux = torch.cat([aux, torch.zeros(1, aux.shape[1])])  # the anchor's own feature is never read
    blocks = tiny_dflash.anchored_blocks(full_aux[None], seq[None], torch.arange(len(seq))[None],
                                         torch.zeros(1, len(seq), dtype=torch.long), torch.tensor([len(ids)]))
    assert drafted == tiny_dflash.draft_to_target(blocks[0, 1:4].argmax(-1)).tolist()


@pytest.mark.parametrize("window,block_causal", [(None, False), (5, False), (5, True)])
def test_attention_document_by_document_equals_the_dense_row(tiny, window, block_causal, monkeypatch):
    """A packed row's blocks attend document by document (`document_groups`): the logits and gradients equal
    those of one dense masked attention over the whole row, with and without a sliding window, and for blocks
    causal inside (the rule for sliding layers)."""
    import engine.algos.dflash.model as dflash_model

    counts = torch.arange(tiny.vocab_size).flip(0)
    draft = build_dflash(tiny, DFlashArgs(num_layers=2, block_size=4, draft_vocab_size=160, sliding_window=window,
                                          block_causal=block_causal),
                         aux_layer_ids=[1, 2, 3], token_counts=counts, seed=2).train()
    assert any(draft.block_causal) == block_causal
    lens = [9, 1, 14, 11]                                         # a one-token document holds no anchor
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    torch.manual_seed(5)
    aux, ids = torch.randn(1, doc.shape[1], draft.fc.in_features), torch.randint(3, 290, (1, doc.shape[1]))
    anchors = torch.tensor([0, 3, 8, 10, 12, 20, 24, 26, 33])      # the first, middle and last rows of documents
    groups = dflash_model.document_groups(doc, anchors, 4)
    assert [(g[2], g[3]) for g in groups] == [(0, 9), (10, 24), (24, 35)] and groups[-1][1] == 9 * 4
    assert dflash_model.document_groups(doc, anchors.flip(0), 4) is None  # unordered anchors: one dense group

    def run():
        out = draft.anchored_blocks(aux, ids, pos, doc, anchors)
        return out, torch.autograd.grad(out.square().sum(), [p for p in draft.parameters() if p.requires_grad])

    grouped, grouped_grads = run()
    monkeypatch.setattr(dflash_model, "document_groups", lambda *args: None)
    dense, dense_grads = run()
    assert torch.allclose(grouped, dense, atol=1e-5)
    for g, d in zip(grouped_grads, dense_grads, strict=True):  # equal up to float rounding (sums in another order)
        assert float((g - d).abs().max()) <= 1e-6 * float(d.abs().max())


def test_dflash_trains_and_writes_a_checkpoint_vllm_rules_accept(tiny_targets, tmp_path):
    import json

    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft
    from testkit.training import train_online

    final, val = train_online("dflash", tiny_targets["llama"], tmp_path / "run", epochs=8,
                              num_layers=1, block_size=4, max_anchors=64)
    assert val[-1]["loss"] < val[0]["loss"]
    assert {"full_acc_0", "pos_acc_2", "est_acceptance_length", "walk_acceptance_length"} <= set(val[-1])
    report = validate_draft(final)
    assert report.ok, [i.message for i in report.errors]
    names = set(tensor_index(final))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight"} <= names
    assert not names & {"lm_head.weight", "embed_tokens.weight", "mask_hidden", "d2t"}  # full vocab: shared head
    config = json.loads((final / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == 4
    assert config["sliding_window_non_causal"] is True  # bidirectional blocks: vLLM serves causal = False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    from engine.targets.loading import load_target

    assert load_dflash(final, load_target(str(tiny_targets["llama"]))).block_size == 4


@pytest.mark.speculators
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_speculators_dflash_computes_our_block_logits(tiny, tmp_path, vocab):
    """Our checkpoint in speculators 0.9.0's DFlashDraftModel: the same logits for the same anchored blocks."""
    pytest.importorskip("speculators")
    from speculators.models.dflash import DFlashSpeculatorConfig

    from engine.algos.dflash.io import save_dflash
    from speculators_ref import load_block_reference

    counts = torch.arange(tiny.vocab_size).flip(0)
    ours = build_dflash(tiny, DFlashArgs(num_layers=2, block_size=4,
                                         draft_vocab_size=160 if vocab == "reduced" else None),
                        aux_layer_ids=[1, 2, 3], seed=3, token_counts=counts).eval()
    with torch.no_grad():  # non-trivial norms, so a swapped norm would show
        for name, p in ours.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    path = save_dflash(ours, tmp_path / "d", dtype=torch.float32)
    ref = load_block_reference(path, DFlashSpeculatorConfig, tiny, lm_head=vocab == "full")
    t = 37
    torch.manual_seed(1)
    aux = torch.randn(1, t, ours.fc.in_features)
    ids = torch.randint(3, tiny.vocab_size, (1, t))
    loss_mask = torch.ones(1, t, dtype=torch.long)
    doc = torch.zeros(1, t, dtype=torch.long)
    last = torch.randn(1, t, tiny.hidden_size)
    with torch.no_grad():
        _, theirs, _, _, indices = ref._backbone_forward(hidden_states=aux, input_ids=ids, loss_mask=loss_mask,
                                                         verifier_last_hidden_states=last, document_ids=doc,
                                                         max_anchors=6)
        anchors = indices.view(-1, 4)[:, 0]
        mine = ours.anchored_blocks(aux, ids, torch.arange(t)[None], doc, anchors)
    assert theirs.view(-1, 4, theirs.shape[-1]).shape == mine.shape
    assert (theirs.view_as(mine) - mine).abs().max() <= 1e-4


@pytest.mark.parametrize("loss_fn", ["ce", "kl"])
def test_training_the_drafted_slots_gives_the_whole_block_loss(tiny, tiny_dflash, loss_fn):
    """Slot 0 of a block is its anchor (weight 0, never valid): the objective projects only slots 1..B-1, and its
    loss and per-slot statistics equal the whole-block computation's (every slot projected, slot 0 masked)."""
    from engine.algos.common.losses import forward_kl
    from engine.algos.dflash.train import DFlashObjective, block_labels, slot_weights
    from engine.targets.verifier import load_verifier_parts

    t, b = 40, tiny_dflash.block_size
    torch.manual_seed(0)
    doc = torch.tensor([[0] * 25 + [1] * 15])
    batch = {"aux": torch.randn(1, t, tiny_dflash.fc.in_features), "input_ids": torch.randint(3, 200, (1, t)),
             "position_ids": torch.cat([torch.arange(25), torch.arange(15)])[None], "document_ids": doc,
             "loss_mask": (torch.rand(1, t) > 0.2).long(), "anchors": torch.tensor([0, 5, 12, 22, 26, 37]),
             "verifier_last": torch.randn(1, t, tiny.hidden_size)}
    objective = DFlashObjective(tiny_dflash, load_verifier_parts(target=tiny), loss_fn=loss_fn,
                                dflash_decay_gamma=4.0, device="cpu")
    with torch.no_grad():
        loss, stats = objective(tiny_dflash, batch)
        full = tiny_dflash.anchored_blocks(*(batch[k] for k in ("aux", "input_ids", "position_ids", "document_ids",
                                                                "anchors")))          # [N, B, Vd]
        labels, valid = block_labels(batch, b)
        labels = objective.draft_ids_of_target[labels]
        valid, labels = valid & (labels >= 0), labels.clamp(min=0)
        w = slot_weights(b, 4.0)[None, :] * valid
        if loss_fn == "kl":
            pos = (batch["anchors"][:, None] + torch.arange(b)[None, :] - 1).clamp(min=0, max=t - 1)
            probs = torch.softmax(objective.norm(batch["verifier_last"][0, pos]) @ objective.head_rows.T, -1)
            per_slot = forward_kl(full, probs)
        else:
            per_slot = torch.nn.functional.cross_entropy(full.flatten(0, 1), labels.flatten(),
                                                         reduction="none").view_as(labels)
    assert valid[:, 1:].any() and not valid[:, 0].any()
    assert loss.item() == pytest.approx(((per_slot * w).sum() / w.sum()).item(), rel=1e-5)
    correct = (full.argmax(-1) == labels) & valid
    for i in range(1, b):
        assert stats[f"pos_acc_{i}_sum"] == float(correct[:, i].sum()) and stats[f"slot_{i}_total"] == valid[:, i].sum()
