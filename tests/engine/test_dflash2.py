"""DFlash2's own behaviour (what every algorithm shares is in tests/engine/test_algorithm_behaviour.py): the grouped
convolution (causal inside a block, the identity at initialisation), the selector's walk (it changes drafts, only
among the unary top-k), decoding = the training path's blocks, training into a checkpoint vLLM's rules accept, the
tensors speculators 0.9.0 writes, clear refusals, and parity with speculators' DFlash2DraftModel."""

from __future__ import annotations

import json

import pytest
import torch

from engine.algos import ALGOS
from engine.algos.dflash2.args import DFlash2Args
from engine.algos.dflash2.io import build_dflash2, save_dflash2
from engine.algos.dflash2.model import grouped_causal_conv
from engine.errors import WorkbenchError
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate_all
from testkit.decoding import PROMPTS  # the decode engine's own prompts

BLOCK = 4


@pytest.fixture(scope="module")
def tiny(tiny_targets):
    """A private copy of the tiny target: DFlash2 drafts share (and freeze) its embedding and head."""
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["llama"]))


def scramble(draft, scale: float = 0.5):
    """Random convolutions and a selector strong enough to change drafts (a fresh draft has identity convolutions
    and a near-zero selector, so a swapped piece would not show)."""
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "conv" in name:
                p.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.startswith("candidate_selector"):
                p.normal_(0.0, scale)
    return draft


@pytest.fixture(scope="module")
def tiny_dflash2(tiny):
    return scramble(build_dflash2(tiny, DFlash2Args(num_layers=2, block_size=BLOCK, selector_rank=16,
                                                    conv_kernel_size=3),
                                  aux_layer_ids=[1, 2, 3], seed=3)).eval()


def test_the_convolution_is_causal_inside_each_block():
    torch.manual_seed(0)
    y, delta, base = torch.randn(3 * BLOCK, 32), torch.randn(3 * BLOCK, 2, 4), torch.randn(2, 32)
    out = grouped_causal_conv(y, delta, base, BLOCK)
    changed = y.clone()
    changed[5] += 1.0                               # block 1, slot 1
    moved = (grouped_causal_conv(changed, delta, base, BLOCK) - out).abs().sum(-1) > 0
    assert moved.nonzero().flatten().tolist() == [5, 6]  # itself and the next slot (2 taps), not block 2's slot 0
    by_hand = (base[0] + delta[6, 0].repeat_interleave(8)) * y[6] + (base[1] + delta[6, 1].repeat_interleave(8)) * y[5]
    assert torch.allclose(out[6], by_hand, atol=1e-6)
    assert torch.allclose(out[4], (base[0] + delta[4, 0].repeat_interleave(8)) * y[4])  # slot 0: no tap behind it


def test_a_fresh_draft_has_identity_convolutions(tiny):
    """speculators' start: every convolution is the identity, so the layers compute DFlash's."""
    draft = build_dflash2(tiny, DFlash2Args(num_layers=1, block_size=BLOCK, selector_rank=8), aux_layer_ids=[1, 2, 3])
    conv = draft.layers[0].attention_conv
    y = torch.randn(2 * BLOCK, tiny.hidden_size)
    prepared, delta = conv.prepare(y)
    assert torch.equal(prepared, y) and torch.equal(conv.finish(y, delta), y)
    assert draft.candidate_selector.predecessor_codebook.std() > 0  # the selector starts random (N(0, std))


def test_the_selector_changes_drafts_and_keeps_them_in_the_top_k(tiny, tiny_dflash2):
    torch.manual_seed(2)
    x = torch.randn(8, BLOCK - 1, tiny.hidden_size)
    anchors = torch.randint(3, tiny.vocab_size, (8,))
    with torch.no_grad():
        walked = tiny_dflash2.greedy_drafts(x, anchors)
        unary = tiny_dflash2.logits(x)
    top = unary.topk(tiny_dflash2.top_k, dim=-1).indices
    assert (walked[..., None] == top).any(-1).all()
    assert (walked != unary.argmax(-1)).any()  # the bilinear term moved some choices off the unary argmax


def test_proposer_block_equals_the_training_block(tiny, tiny_dflash2):
    """The cached decoding path (committed context K/V + one block) drafts what the training forward's block gives
    the walk, and the training forward's teacher-forced scores follow the same edges."""
    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = ALGOS.get("dflash2").proposer(tiny_dflash2)
    logits, aux = TargetRunner(tiny, prop.aux_layer_ids).forward(ids, all_logits=False)
    first = int(logits[-1].argmax())
    prop.start(ids, aux, first)
    drafted = prop.propose(BLOCK - 1, SamplingParams(), None).tokens
    seq = torch.tensor(ids + [first] + drafted)  # the data continues with the drafts: teacher forcing = the walk
    full_aux = torch.cat([aux, torch.zeros(1 + len(drafted), aux.shape[1])])  # features from the anchor on: unread
    args = (full_aux[None], seq[None], torch.arange(len(seq))[None], torch.zeros(1, len(seq), dtype=torch.long),
            torch.tensor([len(ids)]))
    with torch.no_grad():
        x = tiny_dflash2.anchored_hidden(*args)
        walked, scores, _ = tiny_dflash2.walk(tiny_dflash2.norm(x[:, 1:]), torch.tensor([first]),
                                              lambda s: s.argmax(-1))
        # the training forward's drafted slots 1..B-1 (row i - 1 is slot i), their targets the drafts
        _, candidates, forced, _, _ = tiny_dflash2(*args, selector_targets=seq[len(ids) + 1:len(ids) + BLOCK][None])
    assert drafted == walked[0].tolist() and forced.shape[1] == BLOCK - 1
    for i in range(1, BLOCK):  # slot i's unary top-k (in the forward, its last one may be the injected target)
        assert torch.allclose(forced[0, i - 1, :-1], scores[i - 1][0, :-1], atol=1e-5)
        assert torch.equal(candidates[0, i - 1, :-1], torch.topk(tiny_dflash2.logits(x[0, i]), tiny_dflash2.top_k)
                           .indices[:-1])


def test_sampled_drafts_come_with_their_candidate_distribution(tiny, tiny_dflash2):
    ids = prompt_ids(tiny.tokenizer, PROMPTS[0])
    prop = ALGOS.get("dflash2").proposer(tiny_dflash2)
    logits, aux = TargetRunner(tiny, prop.aux_layer_ids).forward(ids, all_logits=False)
    prop.start(ids, aux, int(logits[-1].argmax()))
    proposal = prop.propose(BLOCK - 1, SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))
    q = proposal.probs
    assert q.shape == (BLOCK - 1, tiny.vocab_size) and torch.allclose(q.sum(-1), torch.ones(BLOCK - 1))
    assert ((q > 0).sum(-1) <= tiny_dflash2.top_k).all()
    assert all(q[i, t] > 0 for i, t in enumerate(proposal.tokens))


def test_refusals_name_the_field_and_the_fix(tiny):
    with pytest.raises(ValueError, match="draft_vocab_size"):  # it drafts over the target's full vocabulary
        DFlash2Args(num_layers=1, block_size=BLOCK, draft_vocab_size=160)
    with pytest.raises(WorkbenchError, match="does not divide the target's hidden size 64"):
        build_dflash2(tiny, DFlash2Args(num_layers=1, block_size=BLOCK, conv_group_size=24), aux_layer_ids=[1])
    with pytest.raises(ValueError, match="exceeds block_size"):
        ALGOS.get("dflash2").args_class(block_size=2, conv_kernel_size=3)
    assert "draft_vocab_size" not in ALGOS.get("dflash2").args_class.model_fields  # no flag to refuse later


def test_dflash2_trains_and_writes_a_checkpoint_vllm_rules_accept(tiny_targets, tmp_path):
    from engine.format import vllm_rules as vr
    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft
    from engine.targets.loading import load_target
    from testkit.training import train_online

    final, val = train_online("dflash2", tiny_targets["llama"], tmp_path / "run", epochs=6,
                              num_layers=1, block_size=BLOCK, max_anchors=64, selector_rank=16)
    assert val[-1]["loss"] < val[0]["loss"] and val[-1]["selector_loss"] < val[0]["selector_loss"]
    assert {"unary_loss", "candidate_recall", "est_acceptance_length", "walk_acceptance_length"} <= set(val[-1])
    report = validate_draft(final)
    assert report.ok, [i.message for i in report.errors]
    config = json.loads((final / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash2" and config["architectures"] == ["DFlash2DraftModel"]
    assert config["sliding_window_non_causal"] is True and config["sample_from_anchor"] is False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == BLOCK - 1
    hf = vr.extract_transformers_pre_trained_config(config)
    assert {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 16, "selector_top_k": 16}.items() \
        <= hf["dflash_config"].items()  # vLLM reads all four unconditionally
    names = tensor_index(final)
    target = load_target(str(tiny_targets["llama"]))
    assert tuple(names["candidate_selector.successor_codebook"].shape) == (target.vocab_size, 16)
    assert tuple(names["layers.0.mlp_conv.kernel_projection.weight"].shape) == (2 * 2 * 4, target.hidden_size)
    assert not set(names) & {"lm_head.weight", "embed_tokens.weight", "d2t", "t2d"}
    assert ALGOS.get("dflash2").load(final, target).top_k == 16


def test_our_draft_has_the_tensors_speculators_writes(fixtures_dir):
    """A draft built from speculators 0.9.0's Qwen3-8B DFlash2 config (meta device) holds exactly the tensors its
    state_dict.tsv marks `saved`, with the same shapes."""
    from engine.algos.dflash2.model import DFlash2Draft
    from speculators_ref import saved_and_built_shapes

    saved, ours = saved_and_built_shapes(fixtures_dir / "dflash2_qwen3_8b", DFlash2Draft)
    assert ours == saved


def test_a_saved_draft_loads_and_drafts_the_same(tiny, tiny_dflash2, tmp_path):
    path = save_dflash2(tiny_dflash2, tmp_path / "d", dtype=torch.float32)
    loaded = ALGOS.get("dflash2").load(path, tiny)
    ours, theirs = tiny_dflash2.checkpoint_state(), loaded.checkpoint_state()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = prompt_ids(tiny.tokenizer, [{"role": "user", "content": PROMPTS[0]}])
    params = SamplingParams(max_new_tokens=16)
    outs = [generate_all(TargetRunner(tiny, d.config.aux_hidden_state_layer_ids), ids, params,
                         ALGOS.get("dflash2").proposer(d), BLOCK - 1) for d in (tiny_dflash2, loaded)]
    assert outs[0][0] == outs[1][0]
    assert [(e.drafted, e.accepted) for e in outs[0][1]] == [(e.drafted, e.accepted) for e in outs[1][1]]


@pytest.mark.speculators
def test_speculators_dflash2_computes_our_logits_and_selector_scores(tiny, tiny_dflash2, tmp_path):
    """Our checkpoint in speculators 0.9.0's DFlash2DraftModel: the same unary logits and the same candidate scores
    for the same anchored blocks (teacher-forced predecessors)."""
    pytest.importorskip("speculators")
    from speculators.models.dflash2 import DFlash2SpeculatorConfig

    from speculators_ref import load_block_reference

    path = save_dflash2(tiny_dflash2, tmp_path / "d", dtype=torch.float32)
    ref = load_block_reference(path, DFlash2SpeculatorConfig, tiny, lm_head=True)
    t = 37
    torch.manual_seed(1)
    aux = torch.randn(1, t, tiny_dflash2.fc.in_features)
    ids = torch.randint(3, tiny.vocab_size, (1, t))
    doc = torch.zeros(1, t, dtype=torch.long)
    with torch.no_grad():
        hidden, theirs, _, _, indices = ref._backbone_forward(
            hidden_states=aux, input_ids=ids, loss_mask=torch.ones(1, t, dtype=torch.long),
            verifier_last_hidden_states=torch.randn(1, t, tiny.hidden_size), document_ids=doc, max_anchors=6)
        anchors = indices.view(-1, BLOCK)[:, 0]
        n = anchors.numel()
        targets = ids[0, (anchors[:, None] + torch.arange(1, BLOCK)[None]).clamp(max=t - 1)]
        # ours trains the drafted slots 1..B-1 only (slot 0 is the anchor): theirs compared on the same slots
        mine, candidates, scores, _, _ = tiny_dflash2(aux, ids, torch.arange(t)[None], doc, anchors, targets)
        theirs = theirs.view(n, BLOCK, -1)[:, 1:]
        hidden = hidden.reshape(n, BLOCK, -1)[:, 1:]
        prev = ref._predecessor_ids(ids, indices).reshape(n, BLOCK)[:, 1:]
        theirs_scores = ref.candidate_selector.score_candidates(
            theirs.reshape(1, -1, theirs.shape[-1]), hidden.reshape(1, -1, hidden.shape[-1]), prev.reshape(1, -1),
            candidates.reshape(1, -1, candidates.shape[-1]))
    assert mine.shape == (n, BLOCK - 1, tiny.vocab_size) and (theirs - mine).abs().max() <= 1e-4
    assert (theirs_scores.view_as(scores) - scores).abs().max() <= 1e-4
