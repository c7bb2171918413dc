"""P-EAGLE's own behaviour (what every algorithm shares is in tests/engine/test_algorithm_behaviour.py): sampled
drafts from the distributions they report, decoding = the training forward, COD sampling, training, checkpoints
vLLM's rules accept, a round trip, resumed training, DDP, the built-in target with accepted drafts (slow), and parity
with speculators 0.9.0's PEagleDraftModel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.algos import ALGOS
from engine.algos.peagle.args import PEagleArgs
from engine.algos.peagle.io import build_peagle, load_peagle, save_peagle
from engine.algos.peagle.train import cod_sample
from engine.generate.prompt import prompt_ids
from engine.generate.runner import TargetRunner
from engine.generate.sampling import SamplingParams
from engine.generate.speculative import generate_all
from testkit.decoding import PROMPTS  # the decode engine's own prompts
from testkit.drafts import peagle_from_eagle3

K = 4  # depths of the tiny draft


@pytest.fixture(scope="module")
def tiny(tiny_targets):
    """A private copy of the tiny target (drafts share its embedding)."""
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["llama"]))


@pytest.fixture(scope="module")
def tiny_peagle(tiny):
    counts = torch.arange(tiny.vocab_size).flip(0)  # reduced vocabulary: exercises d2t
    draft = build_peagle(tiny, PEagleArgs(num_layers=2, draft_vocab_size=160, speculative_tokens=K,
                                          sliding_window=None, mask_token_id=300),
                         aux_layer_ids=[1, 2, 3], token_counts=counts).eval()
    with torch.no_grad():  # a mask row unlike the target's, as after training
        draft.mask_embedding.normal_(0.0, 0.2)
    return draft


def proposer(draft):
    return ALGOS.get("peagle").proposer(draft)


def test_proposer_block_equals_the_training_forward(tiny, tiny_peagle):
    """The cached decoding path (committed pairs + one block) computes `parallel_forward`'s chain at that anchor,
    also after a verification step rolled the cache back."""
    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = proposer(tiny_peagle)
    runner = TargetRunner(tiny, prop.aux_layer_ids)
    logits, aux = runner.forward(ids, all_logits=False)
    first = int(logits[-1].argmax())
    prop.start(ids, aux, first)
    prop.propose(K, SamplingParams(), None)
    seq = ids + [first]
    full_logits, full_aux = runner.forward(seq, all_logits=True)
    nxt = int(full_logits[-1].argmax())
    prop.update([], nxt, full_aux[-1:])                      # nothing accepted: the next step starts after `first`
    drafted = prop.propose(K, SamplingParams(), None).tokens
    seq = seq + [nxt]
    g = full_aux.unsqueeze(0)                                 # g_0..g_{n-1} of seq[:-1]
    x = torch.tensor(seq[1:])[None]                           # rows r: (g_r, x_{r+1})
    t = x.shape[1]
    anchor = t - 1
    out = tiny_peagle.parallel_forward(g, x, torch.arange(1, t + 1)[None], torch.zeros_like(x),
                                       torch.full((K - 1,), anchor), torch.arange(1, K))[0]
    chain = torch.cat([out[anchor: anchor + 1], out[t:]])
    assert drafted == tiny_peagle.draft_to_target(chain.argmax(-1)).tolist()


def test_sampled_drafts_come_from_the_distributions_they_report(tiny, tiny_peagle):
    """At temperature 1 each of the k drafts is drawn from the distribution the proposer hands to verification
    (the engine's rejection sampling is lossless given that: tests/engine/test_generate.py)."""
    from testkit.decoding import chi_square_pvalue

    ids = prompt_ids(tiny.tokenizer, PROMPTS[1])
    prop = proposer(tiny_peagle)
    logits, aux = TargetRunner(tiny, prop.aux_layer_ids).forward(ids, all_logits=False)
    prop.start(ids, aux, int(logits[-1].argmax()))
    committed = prop.cache.length
    greedy = prop.propose(K, SamplingParams(), None).tokens
    prop.cache.crop(committed)
    params = SamplingParams(temperature=1.0)
    counts = torch.zeros(K, tiny.vocab_size)
    for seed in range(1500):
        proposal = prop.propose(K, params, torch.Generator().manual_seed(seed))
        prop.cache.crop(committed)                            # the same state every time
        counts[torch.arange(K), torch.tensor(proposal.tokens)] += 1
    q = proposal.probs                                        # [K, V]
    assert torch.allclose(q.sum(-1), torch.ones(K)) and float(q[:, ~tiny_peagle.t2d].sum()) == 0.0
    assert q.argmax(-1).tolist() == greedy
    assert min(chi_square_pvalue(counts[j], q[j]) for j in range(K)) > 1e-3


def test_cod_sampling_keeps_whole_rollouts_inside_documents_and_decays():
    torch.manual_seed(0)
    t = 400
    doc = torch.cat([torch.zeros(150, dtype=torch.long), torch.ones(250, dtype=torch.long)])
    mask = torch.ones(t, dtype=torch.bool)
    mask[:20] = False                                          # a prompt: not in the loss
    anchors, depths = cod_sample(mask, doc, num_depths=8, ratio=0.7, ratio_min=0.2, max_anchors=None)
    n = int((mask[1:] & (doc[1:] == doc[:-1])).sum())         # candidate anchors: depth 1 in the loss and document
    assert int((depths == 1).sum()) == int(n * 0.7) and int((depths == 2).sum()) == int(n * 0.49)
    for d in range(1, 8):
        a = anchors[depths == d]
        assert 0 < a.numel() <= int(n * max(0.7 ** d, 0.2))
        assert torch.equal(a, a.sort().values)                  # grouped by depth, anchors ascending
        assert bool(mask[a + d].all()) and bool((doc[a + d] == doc[a]).all())
        if d > 1:
            assert bool(torch.isin(a, anchors[depths == d - 1]).all())  # the whole rollout prefix is kept
    assert torch.equal(depths, depths.sort().values)
    capped, _ = cod_sample(mask, doc, num_depths=3, ratio=0.7, ratio_min=0.2, max_anchors=50)
    assert capped.numel() == int(50 * 0.7) + int(50 * 0.49)


def test_the_objective_runs_the_heads_on_the_loss_elements_only_and_loses_nothing(tiny, tiny_peagle, tiny_targets):
    """The objective gives the draft only the elements in the loss (`rows`): loss, metrics and gradients equal
    those of the head over every element, masked afterwards (how it was computed before)."""
    from engine.algos.common.losses import forward_kl
    from engine.algos.eagle3.train import target_logits
    from engine.algos.peagle.train import PEagleObjective, depth_stats, element_rows
    from engine.targets.verifier import load_verifier_parts

    torch.manual_seed(4)
    t = 48
    doc = torch.cat([torch.zeros(20, dtype=torch.long), torch.ones(28, dtype=torch.long)])[None]
    mask = torch.ones(1, t, dtype=torch.bool)
    mask[0, :6], mask[0, 20:27] = False, False                    # two prompts, not in the loss
    anchors, depths = cod_sample(mask[0], doc[0], num_depths=K, ratio=0.8, ratio_min=0.3, max_anchors=None)
    batch = {"aux": torch.randn(1, t, tiny_peagle.fc.in_features), "input_ids": torch.randint(3, 290, (1, t)),
             "position_ids": torch.cat([torch.arange(1, 21), torch.arange(1, 29)])[None], "document_ids": doc,
             "loss_mask": mask, "anchors": anchors, "depths": depths,
             "verifier_last": torch.randn(1, t, tiny.hidden_size)}
    objective = PEagleObjective(tiny_peagle, load_verifier_parts(str(tiny_targets["llama"])), num_depths=K,
                                device="cpu")
    params = [p for p in tiny_peagle.parameters() if p.requires_grad]

    def grads(loss):
        return [g.clone() for g in torch.autograd.grad(loss, params)]

    head_rows = []
    hook = tiny_peagle.lm_head.register_forward_hook(lambda m, x, out: head_rows.append(x[0].shape[-2]))
    try:
        loss, stats = objective(tiny_peagle, batch)
    finally:
        hook.remove()
    anchor, depth, row = element_rows(batch)
    keep = mask[0][row]
    assert 0 < int(keep.sum()) < keep.numel()                     # some elements are left out of the loss
    assert head_rows == [int(keep.sum())]                         # and the draft's head never sees them
    logits = tiny_peagle.parallel_forward(batch["aux"], batch["input_ids"], batch["position_ids"], doc, anchors,
                                          depths)[0]                  # every element [T+M, Vd]
    targets = target_logits(batch["verifier_last"][0], objective.norm, objective.head_rows)
    kl = forward_kl(logits[keep], torch.softmax(targets[row[keep]], -1))
    full_loss = kl.sum() / keep.sum()
    full_stats = depth_stats(logits.argmax(-1) == targets.argmax(-1)[row], keep, anchor, depth, kl, K, t)
    assert torch.allclose(loss, full_loss, rtol=1e-5, atol=1e-6)
    assert stats.keys() == full_stats.keys()
    assert all(abs(stats[k] - full_stats[k]) <= 1e-4 * max(1.0, abs(full_stats[k])) for k in stats), stats
    for mine, full in zip(grads(loss), grads(full_loss), strict=True):
        assert torch.allclose(mine, full, rtol=1e-4, atol=1e-6)


def test_peagle_trains_and_writes_a_checkpoint_vllm_rules_accept(tiny_targets, tmp_path):
    import json

    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft
    from engine.targets.loading import load_target
    from testkit.training import train_online

    final, val = train_online("peagle", tiny_targets["llama"], tmp_path / "run", epochs=8,
                              num_layers=2, num_depths=4, max_anchors=64)
    assert val[-1]["loss"] < val[0]["loss"]
    assert {"full_acc_0", "pos_acc_3", "est_acceptance_length", "walk_acceptance_length"} <= set(val[-1])
    report = validate_draft(final)
    assert report.ok, [i.message for i in report.errors]
    shapes = tensor_index(final)
    names = set(shapes)
    assert {"fc.weight", "mask_hidden", "embed_tokens.weight", "lm_head.weight", "layers.0.hidden_norm.weight",
            "layers.1.self_attn.q_norm.weight"} <= names
    assert not names & {"mask_embedding", "layers.1.hidden_norm.weight", "verifier_lm_head.weight"}
    config = json.loads((final / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["mask_token_id"] is not None
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    target = load_target(str(tiny_targets["llama"]))
    reloaded = load_peagle(final, target)
    mask_row = reloaded.mask_embedding.detach()
    target_row = target.embed_tokens().weight[reloaded.mask_token_id].detach()
    assert not torch.allclose(mask_row, target_row)  # the mask token's embedding row was trained


def test_checkpoint_round_trip_keeps_the_drafts(tiny, tiny_peagle, tmp_path):
    path = save_peagle(tiny_peagle, tmp_path / "d", dtype=torch.float32)
    again = load_peagle(path, tiny)
    ids = prompt_ids(tiny.tokenizer, PROMPTS[0])
    params = SamplingParams(max_new_tokens=16)
    outs = []
    for draft in (tiny_peagle, again):
        prop = proposer(draft)
        _, events = generate_all(TargetRunner(tiny, prop.aux_layer_ids), ids, params, prop, K)
        outs.append([(e.drafted, e.accepted) for e in events])
    assert outs[0] == outs[1]


SHIPPED_EAGLE3 = Path(__file__).resolve().parents[2] / "assets" / "drafts" / "smollm2-135m-instruct-eagle3"


def _builtin_identity(builtin_target, num_prompts):
    from engine.data.prompts.load import load_prompts

    draft = peagle_from_eagle3(SHIPPED_EAGLE3, builtin_target, 5)
    params = SamplingParams(max_new_tokens=16, eos_token_ids=[builtin_target.tokenizer.eos_token_id])
    prompts = load_prompts("sharegpt", num_prompts, 0, 300)
    assert len(prompts) == num_prompts
    base_runner = TargetRunner(builtin_target)
    accepted = 0
    for prompt in prompts:
        ids = prompt_ids(builtin_target.tokenizer, prompt)
        base, _ = generate_all(base_runner, ids, params)
        prop = proposer(draft)
        spec, events = generate_all(TargetRunner(builtin_target, prop.aux_layer_ids), ids, params, prop, 5)
        assert spec == base
        accepted += sum(e.accepted for e in events)
    assert accepted > 0  # the identity held while drafts were being accepted


@pytest.mark.slow
def test_builtin_greedy_identity_on_50_prompts(builtin_target):
    """Greedy parallel drafting on the built-in target (fp32) with drafts accepted (slot 1 = the shipped EAGLE-3's
    step 0) gives the target's own text on 50 held-out prompts (the behaviour suite runs a random draft there)."""
    _builtin_identity(builtin_target, 50)


@pytest.mark.speculators
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_speculators_peagle_computes_our_logits(tiny, tmp_path, vocab):
    """Our checkpoint in speculators 0.9.0's PEagleDraftModel: the same logits for the same (anchor, depth)
    elements (its COD sampler replaced by fixed indices: both sides see one sample)."""
    pytest.importorskip("speculators")
    import speculators.models.peagle.core as ref_core
    from speculators import SpeculatorModel
    from speculators.models.peagle import PEagleSpeculatorConfig

    counts = torch.arange(tiny.vocab_size).flip(0)
    ours = build_peagle(tiny, PEagleArgs(num_layers=2, speculative_tokens=K, mask_token_id=300, norm_before_fc=True,
                                         draft_vocab_size=160 if vocab == "reduced" else None),
                        aux_layer_ids=[1, 2, 3], seed=3, token_counts=counts).eval()
    with torch.no_grad():  # non-trivial norms and mask row, so a swapped norm or row would show
        for name, p in ours.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        ours.mask_embedding.normal_(0.0, 0.2)
    path = save_peagle(ours, tmp_path / "d", dtype=torch.float32)
    cfg = PEagleSpeculatorConfig.from_pretrained(path)
    cfg.transformer_layer_config._attn_implementation = "eager"  # CPU: no flex attention
    ref = SpeculatorModel.from_pretrained(path, config=cfg).eval()
    t = 37
    torch.manual_seed(1)
    aux = torch.randn(1, t, ours.fc.in_features)
    ids = torch.randint(3, 290, (1, t))
    doc = torch.zeros(1, t, dtype=torch.long)
    anchors = torch.cat([torch.tensor([2, 5, 9, 20, 30]), torch.tensor([5, 20, 30]), torch.tensor([20])])
    depths = torch.cat([torch.full((5,), 1), torch.full((3,), 2), torch.full((1,), 3)])
    seen = {}

    def fixed_sample(**kwargs):
        return torch.cat([torch.arange(t), anchors]), torch.cat([torch.zeros(t, dtype=torch.long), depths])

    def capture(logits, targets, loss_mask, anchor_pos, depth, num_depths, loss_config=None):
        seen["logits"] = logits
        return torch.zeros(()), {}

    mp = pytest.MonkeyPatch()
    mp.setattr(ref_core, "generate_cod_sample_indices", fixed_sample)
    mp.setattr(ref_core, "compute_metrics", capture)
    try:
        with torch.no_grad():
            ref(hidden_states=aux, input_ids=ids, document_ids=doc, position_ids=torch.arange(t)[None],
                loss_mask=torch.ones(1, t), verifier_last_hidden_states=torch.randn(1, t, tiny.hidden_size),
                num_depths=K)
    finally:
        mp.undo()
    with torch.no_grad():
        mine = ours.parallel_forward(aux, ids, torch.arange(t)[None], doc, anchors, depths)
    assert seen["logits"].shape == mine.shape
    assert (seen["logits"] - mine).abs().max() <= 1e-4


def test_offline_training_resumes_to_identical_weights(tiny_targets, tmp_path, monkeypatch):
    """Extracted hidden states, COD sampling drawn from the trainer's checkpointed RNG: a run interrupted mid-epoch
    and resumed ends with the same weights (mask row and mask_hidden included) as an uninterrupted one."""
    from safetensors.torch import load_file

    from engine.train.trainer import Trainer
    from testkit.training import config, extract

    data = extract(tiny_targets["llama"], tmp_path / "hs", n=16, max_length=96)
    kw = {"algo": "peagle", "epochs": 2, "algo_args": {"num_layers": 1, "num_depths": 3, "max_anchors": 32}}
    Trainer(config(tiny_targets["llama"], data, tmp_path / "a", **kw)).run()
    full = Trainer(config(tiny_targets["llama"], data, tmp_path / "b", **kw))
    stop_at = full.total_steps // 3
    original = Trainer._micro_step
    calls = {"n": 0}

    def interrupting(self, batch):
        calls["n"] += 1
        if calls["n"] > stop_at:
            raise KeyboardInterrupt  # what SIGTERM becomes in the CLI
        return original(self, batch)

    monkeypatch.setattr(Trainer, "_micro_step", interrupting)
    with pytest.raises(KeyboardInterrupt):
        full.run()
    monkeypatch.setattr(Trainer, "_micro_step", original)
    Trainer(config(tiny_targets["llama"], data, tmp_path / "b", **kw)).run()
    a = load_file(str(tmp_path / "a" / "draft" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "draft" / "model.safetensors"))
    assert a.keys() == b.keys() and {"mask_hidden", "embed_tokens.weight"} <= a.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_ddp_two_processes_agree(tiny_targets, tmp_path):
    """`torchrun` with two processes: each rank draws its own COD samples, the replicas stay identical."""
    import json
    import os
    import subprocess
    import sys

    from engine.format.validate import validate_draft
    from testkit.training import ROOT, extract

    data = extract(tiny_targets["llama"], tmp_path / "hs", n=16, max_length=96)
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "engine", "train", "--algo", "peagle", "--target", str(tiny_targets["llama"]), "--data", str(data),
           "--out", str(out), "--max-steps", "4", "--tokens-per-batch", "192", "--max-length", "96",
           "--num-layers", "1", "--num-depths", "3", "--warmup-steps", "1", "--val-fraction", "0.2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((out / "ddp_check.json").read_text())
    assert check["world"] == 2 and check["ranks_agree"] is True
    assert validate_draft(out / "draft").ok
