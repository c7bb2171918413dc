"""Converters: every published source layout, built as a tiny synthetic checkpoint with the real key names and
config fields (tests/convert_layouts.py), is detected, mapped, refused when it does not map, converted, validated,
loaded and test-drafted; layouts that cannot be converted say why; the results match speculators 0.9.0's converters."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from convert_layouts import (
    FF,
    HD,
    LAYOUTS,
    MASK,
    NH,
    NKV,
    RANK,
    VD,
    H,
    R,
    V,
    dflash2_zlab,
    dflash_zlab,
    dspark_deepspec,
    layer_tensors,
    modelopt,
    peagle_aws,
    peagle_specforge,
    safeailab,
    specforge,
    write_checkpoint,
)
from engine.convert import ConvertOptions, convert, detect, mapping_table, plan, verify
from engine.errors import WorkbenchError
from engine.format.checkpoint import tensor_index
from engine.format.validate import validate_draft

ROOT = Path(__file__).resolve().parents[2]
@pytest.mark.parametrize("fmt", list(LAYOUTS))
def test_each_published_layout_is_detected(tmp_path, fmt):
    assert detect(LAYOUTS[fmt](tmp_path / "src")).format == fmt


def test_a_converted_draft_whose_weights_hold_nan_is_reported_though_the_output_stays_lossless(tmp_path,
                                                                                               tiny_targets):
    """The finite check looks at the draft's own outputs: NaN drafts are rejected, so the output alone proves
    nothing."""
    from safetensors.torch import load_file, save_file

    verifier = str(tiny_targets["llama"])
    out = convert(LAYOUTS["eagle3-safeailab"](tmp_path / "src"), tmp_path / "out", verifier=verifier,
                  allow_pickle=True, aux_layer_ids=[1, 2, 3])
    assert verify(out, verifier, max_new_tokens=6).ok
    (weights,) = out.glob("*.safetensors")
    tensors = load_file(str(weights))
    tensors["fc.weight"] = torch.full_like(tensors["fc.weight"], float("nan"))
    save_file(tensors, str(weights))
    verdict = verify(out, verifier, max_new_tokens=6)
    assert not verdict.ok and "not finite" in verdict.drafted and "fc" in verdict.drafted, verdict.to_json()


@pytest.mark.parametrize("fmt,arch", [("eagle3-safeailab", "llama"), ("eagle3-specforge", "llama"),
                                      ("eagle3-modelopt", "llama"), ("eagle3-qwen3", "qwen3"),
                                      ("dflash-zlab", "qwen3"), ("peagle-specforge", "llama"),
                                      ("peagle-aws", "llama"), ("dspark-deepspec", "qwen3"),
                                      ("dflash2-zlab", "qwen3")])
def test_each_layout_converts_validates_loads_and_drafts(tmp_path, tiny_targets, fmt, arch):
    src = LAYOUTS[fmt](tmp_path / "src")
    verifier = str(tiny_targets[arch])
    # the config records none, and a 4-layer verifier's defaults [2, N//2, N-3] collapse to two ids
    given = [1, 2, 3] if fmt in ("eagle3-safeailab", "eagle3-specforge", "peagle-specforge", "peagle-aws") else None
    out = convert(src, tmp_path / "out", verifier=verifier, allow_pickle=True, aux_layer_ids=given)
    verdict = verify(out, verifier, max_new_tokens=6)
    assert verdict.ok, verdict.to_json()
    assert verdict.drafted.startswith("ok") and "identical" in verdict.drafted
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == verifier
    names = tensor_index(out)
    assert not any(n.startswith("midlayer.") or "qkv_proj" in n or "g_proj" in n for n in names)
    if fmt == "eagle3-modelopt":  # two layers, ids kept as recorded, t2d derived from d2t
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and "layers.1.self_attn.q_proj.weight" in names
        assert names["t2d"].shape == (V,)
    if fmt == "eagle3-qwen3":
        assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
        assert "layers.0.self_attn.q_norm.weight" in names
    if fmt == "dflash-zlab":
        assert cfg["aux_hidden_state_layer_ids"] == [1, 2, 3] and cfg["mask_token_id"] == 5  # z-lab ids + 1
    k = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    if fmt.startswith("peagle-"):  # the mask token from peagle_config.json / ptd_token_id, the draft's own table
        assert cfg["speculators_model_type"] == "peagle" and cfg["mask_token_id"] == MASK
        assert "mask_hidden" in names and names["embed_tokens.weight"].shape == (V, H)
        assert "layers.1.self_attn.q_proj.weight" in names and not cfg["norm_before_residual"]
    if fmt == "peagle-specforge":  # K = num_depths of peagle_config.json; the reduced vocabulary kept
        assert k == 4 and cfg["draft_vocab_size"] == VD and names["t2d"].shape == (V,)
    if fmt == "peagle-aws":  # an identity d2t/t2d over the full vocabulary is not what vLLM loads: dropped
        assert k == 8 and cfg["draft_vocab_size"] == V and "d2t" not in names and "t2d" not in names
    if fmt == "dspark-deepspec":  # DeepSpec ids + 1; every slot predicts; the verifier's embedding/head shared
        assert cfg["aux_hidden_state_layer_ids"] == [1, 2, 3] and cfg["block_size"] == k == 4
        assert cfg["mask_token_id"] == MASK and cfg["markov_rank"] == R and cfg["sample_from_anchor"]
        assert "markov_head.markov_w1.weight" in names and "confidence_head.proj.bias" in names
        assert "embed_tokens.weight" not in names and "lm_head.weight" not in names
    if fmt == "dflash2-zlab":  # z-lab ids + 1; the DFlash2 settings from dflash_config; full vocabulary
        assert cfg["speculators_model_type"] == "dflash2" and cfg["aux_hidden_state_layer_ids"] == [1, 2, 3]
        assert cfg["selector_rank"] == RANK and cfg["conv_kernel_size"] == 2 and cfg["conv_group_size"] == 16
        assert k == 3 and cfg["mask_token_id"] == MASK and cfg["sliding_window_non_causal"] is True
        assert names["candidate_selector.successor_codebook"].shape == (V, RANK)


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta=10000.0):  # x [nh, T, hd], rotate-half RoPE as the published Llama code
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    freqs = torch.outer(pos.float(), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def safeailab_forward(w: dict[str, torch.Tensor], embed: torch.Tensor, aux: torch.Tensor, ids: torch.Tensor):
    """SafeAILab's EAGLE-3 draft step (traineagle3/cnets.py Model + LlamaDecoderLayeremb), written from its
    definition: fc over the aux states; residual = fc output; cat(input_layernorm(emb), hidden_norm(h)); causal
    attention; MLP; final norm; lm_head. ids [T], aux [T, 3H] -> logits [T, VD]."""
    def m(n: str) -> torch.Tensor:
        return w["midlayer." + n]

    hidden = aux @ w["fc.weight"].T  # [T, H]
    x = torch.cat([_rms(embed[ids], m("input_layernorm.weight")), _rms(hidden, m("hidden_norm.weight"))], -1)
    t = ids.shape[0]
    q = (x @ m("self_attn.q_proj.weight").T).view(t, NH, HD).transpose(0, 1)
    k = (x @ m("self_attn.k_proj.weight").T).view(t, NKV, HD).transpose(0, 1)
    v = (x @ m("self_attn.v_proj.weight").T).view(t, NKV, HD).transpose(0, 1)
    pos = torch.arange(t)
    q, k = _rope(q, pos), _rope(k, pos)
    k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
    scores = (q @ k.transpose(-1, -2)) / HD ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, NH * HD) @ m("self_attn.o_proj.weight").T
    h = hidden + attn
    g = _rms(h, m("post_attention_layernorm.weight"))
    h = h + (torch.nn.functional.silu(g @ m("mlp.gate_proj.weight").T) * (g @ m("mlp.up_proj.weight").T)) \
        @ m("mlp.down_proj.weight").T
    return _rms(h, w["norm.weight"]) @ w["lm_head.weight"].T


def test_converted_eagle3_computes_the_published_forward(tmp_path, tiny_llama, tiny_targets):
    from engine.algos.common.layers import DraftCache
    from engine.algos.loading import load_draft

    src = safeailab(tmp_path / "src", pickled=False)
    out = convert(src, tmp_path / "out", verifier=str(tiny_targets["llama"]), aux_layer_ids=[1, 2, 3])
    draft = load_draft(out, tiny_llama)
    from safetensors.torch import load_file

    w = load_file(str(src / "model.safetensors"))
    torch.manual_seed(0)
    ids, aux = torch.randint(0, V, (7,)), torch.randn(7, 3 * H)
    want = safeailab_forward(w, tiny_llama.embed_tokens().weight.detach(), aux, ids)
    with torch.no_grad():
        _, got = draft.forward_cached(ids[None], draft.fuse(aux[None]), torch.arange(7)[None], DraftCache())
    torch.testing.assert_close(got[0], want, atol=2e-5, rtol=1e-4)
    # the draft-vocabulary ids map back to the same target tokens as the source's d2t says
    assert torch.equal(draft.draft_to_target(torch.arange(VD)), torch.arange(VD) + w["d2t"])


@pytest.fixture(scope="module")
def tiny_qwen3(tiny_targets):
    from engine.targets.loading import load_target

    return load_target(str(tiny_targets["qwen3"]))


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:  # [T, n*HD] -> [n, T, HD]
    return x.view(x.shape[0], n, HD).transpose(0, 1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [NH,Tq,HD], k/v [NKV,Tk,HD] (grouped heads), mask [Tq,Tk] (True: visible) -> [Tq, NH*HD]."""
    k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
    scores = ((q @ k.transpose(-1, -2)) / HD ** 0.5).masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(q.shape[1], NH * HD)


def _mlp(x: torch.Tensor, w: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T


def peagle_forward(w: dict[str, torch.Tensor], first: str, ids: torch.Tensor, aux: torch.Tensor,
                   pos: torch.Tensor) -> torch.Tensor:
    """One P-EAGLE parallel step as SpecForge's PEagleDraftModel (and vLLM's eagle3 + parallel_drafting) computes
    it, written from that definition: ids [n] (the committed tokens, then K-1 mask tokens), aux [n, 3H] (their
    features, then mask_hidden rows), pos [n] -> logits [n, Vd]. The draft's own embedding; fc; layer 0 splits
    [embedding; hidden] with residual = the raw fc output; Llama layers; causal attention over the n rows
    (the block is the last rollout); final norm; lm_head."""
    e, h = w["embed_tokens.weight"][ids], aux @ w["fc.weight"].T
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("layers."))
    x = h
    for i in range(layers):
        p = first if i == 0 else f"layers.{i}."
        residual = x
        inp = torch.cat([_rms(e, w[p + "input_layernorm.weight"]), _rms(h, w[p + "hidden_norm.weight"])], -1) \
            if i == 0 else _rms(x, w[p + "input_layernorm.weight"])
        q = _rope(_heads(inp @ w[p + "self_attn.q_proj.weight"].T, NH), pos)
        k = _rope(_heads(inp @ w[p + "self_attn.k_proj.weight"].T, NKV), pos)
        v = _heads(inp @ w[p + "self_attn.v_proj.weight"].T, NKV)
        x = residual + _attend(q, k, v, causal) @ w[p + "self_attn.o_proj.weight"].T
        x = x + _mlp(_rms(x, w[p + "post_attention_layernorm.weight"]), w, p)
    return _rms(x, w["norm.weight"]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("fmt,first", [("peagle-specforge", "layers.0."), ("peagle-aws", "midlayer.")])
def test_converted_peagle_computes_the_published_forward(tmp_path, tiny_llama, tiny_targets, fmt, first):
    from safetensors.torch import load_file

    from engine.algos.common.layers import DraftCache
    from engine.algos.loading import load_draft

    src = LAYOUTS[fmt](tmp_path / "src")
    out = convert(src, tmp_path / "out", verifier=str(tiny_targets["llama"]), aux_layer_ids=[1, 2, 3])
    draft = load_draft(out, tiny_llama)
    w = load_file(str(src / "model.safetensors"))
    torch.manual_seed(0)
    t, k = 5, 4  # 5 committed (token, feature) pairs, then k-1 mask slots: k drafts from one forward
    ids = torch.cat([torch.randint(0, V - 1, (t,)), torch.full((k - 1,), MASK)])
    aux = torch.randn(t, 3 * H)
    pos = torch.arange(1, t + k)  # EAGLE-3's shifted positions
    want = peagle_forward(w, first, ids, torch.cat([aux, w["mask_hidden"].view(1, -1).expand(k - 1, -1)]), pos)
    with torch.no_grad():
        got = draft.block_cached(ids[None], draft.slot_features(aux, k - 1), pos[None], DraftCache(), k)
    torch.testing.assert_close(got, want[-k:], atol=2e-5, rtol=1e-4)
    if "d2t" in w and fmt == "peagle-specforge":
        assert torch.equal(draft.draft_to_target(torch.arange(VD)), torch.arange(VD) + w["d2t"])


def block_forward(w: dict[str, torch.Tensor], embed: torch.Tensor, aux: torch.Tensor,
                  block_ids: torch.Tensor, theta: float = 1000000.0) -> torch.Tensor:
    """The DFlash block forward as z-lab's DFlashDraftModel (and DeepSpec's DSpark backbone) compute it, written
    from that definition: aux [T, 3H] features of the committed positions 0..T-1, block_ids [B] at positions
    T..T+B-1 -> the normed output [B, H]. c = hidden_norm(fc(aux)); per layer q = q_norm(q_proj(x_n)) from the
    block only, k = k_norm([k_proj(c); k_proj(x_n)]), v = [v_proj(c); v_proj(x_n)]; every slot sees the whole
    context and the whole block; a fused qkv_proj is [q; k; v]."""
    c = _rms(aux @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embed[block_ids]
    t, b = aux.shape[0], block_ids.shape[0]
    pos_ctx, pos_blk = torch.arange(t), torch.arange(t, t + b)
    layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("layers."))
    for i in range(layers):
        p = f"layers.{i}."
        if p + "self_attn.qkv_proj.weight" in w:
            wq, wk, wv = w[p + "self_attn.qkv_proj.weight"].split([NH * HD, NKV * HD, NKV * HD])
        else:
            wq, wk, wv = (w[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        xn = _rms(x, w[p + "input_layernorm.weight"])
        q = _rope(_rms(_heads(xn @ wq.T, NH), w[p + "self_attn.q_norm.weight"]), pos_blk, theta)
        k = _rms(_heads(torch.cat([c @ wk.T, xn @ wk.T]), NKV), w[p + "self_attn.k_norm.weight"])
        k = _rope(k, torch.cat([pos_ctx, pos_blk]), theta)
        v = _heads(torch.cat([c @ wv.T, xn @ wv.T]), NKV)
        x = x + _attend(q, k, v, torch.ones(b, t + b, dtype=torch.bool)) @ w[p + "self_attn.o_proj.weight"].T
        x = x + _mlp(_rms(x, w[p + "post_attention_layernorm.weight"]), w, p)
    return _rms(x, w["norm.weight"])


def _draft_block(draft, aux: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Our converted DFlash-family draft on the same inputs: decoder output [1, B, H]."""
    t, b = aux.shape[0], block_ids.shape[0]
    ctx = draft.context_kv(draft.context(aux[None]), torch.arange(t)[None])
    return draft.block_forward(block_ids[None], torch.arange(t, t + b)[None], ctx, torch.ones(b, t, dtype=torch.bool))


def test_converted_dflash_computes_the_published_forward(tmp_path, tiny_qwen3, tiny_targets):
    from safetensors.torch import load_file

    from engine.algos.loading import load_draft

    src = dflash_zlab(tmp_path / "src")
    draft = load_draft(convert(src, tmp_path / "out", verifier=str(tiny_targets["qwen3"])), tiny_qwen3)
    w = load_file(str(src / "model.safetensors"))
    torch.manual_seed(0)
    aux, block = torch.randn(6, 3 * H), torch.tensor([17, 5, 5, 5])  # the anchor, then z-lab's mask token 5
    embed, head = tiny_qwen3.embed_tokens().weight.detach(), tiny_qwen3.lm_head().weight.detach()
    want = block_forward(w, embed, aux, block) @ head.T  # z-lab shares the target's embedding and head
    with torch.no_grad():
        got = draft.logits(_draft_block(draft, aux, block)[0])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_converted_dspark_computes_the_published_forward(tmp_path, tiny_qwen3, tiny_targets):
    """DeepSpec's DSpark: the backbone above, base logits by its (the target's) lm_head, then per slot the Markov
    bias W2(W1[prev]) (prev: the anchor, then each slot's greedy draft) and the confidence proj([h_k; W1[prev]])."""
    from safetensors.torch import load_file

    from engine.algos.loading import load_draft

    embed, head = tiny_qwen3.embed_tokens().weight.detach(), tiny_qwen3.lm_head().weight.detach()
    src = dspark_deepspec(tmp_path / "src", shared=(embed, head))
    draft = load_draft(convert(src, tmp_path / "out", verifier=str(tiny_targets["qwen3"])), tiny_qwen3)
    w = load_file(str(src / "model.safetensors"))
    torch.manual_seed(0)
    aux, anchor = torch.randn(6, 3 * H), 17
    block = torch.tensor([anchor] + [MASK] * 3)
    hn = block_forward(w, w["embed_tokens.weight"], aux, block)
    base, prev, want, want_conf = hn @ w["lm_head.weight"].T, anchor, [], []
    for k in range(block.shape[0]):
        e = w["markov_head.markov_w1.weight"][prev]
        want.append(base[k] + e @ w["markov_head.markov_w2.weight"].T)
        want_conf.append(torch.cat([hn[k], e]) @ w["confidence_head.proj.weight"][0]
                         + w["confidence_head.proj.bias"][0])
        prev = int(want[-1].argmax())
    with torch.no_grad():
        x = _draft_block(draft, aux, block)
        tokens, logits, conf = draft.draft_sequentially(x, torch.tensor([anchor]), 4, lambda u: u.argmax(-1))
    torch.testing.assert_close(torch.stack(logits)[:, 0], torch.stack(want), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(conf[0], torch.stack(want_conf), atol=2e-5, rtol=1e-4)
    assert tokens[0].tolist() == [int(u.argmax()) for u in want]


def _conv(y: torch.Tensor, delta: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """z-lab's grouped dynamic causal convolution over one block, from its definition: y [B, H], delta [B, taps, G],
    base [taps, H] -> out_i = sum_t (base[t] + delta_i[t, group]) * y_{i-t} (taps before slot 0 read zero)."""
    out = torch.zeros_like(y)
    group = H // delta.shape[-1]
    for i in range(y.shape[0]):
        for t in range(min(base.shape[0], i + 1)):
            out[i] += (base[t] + delta[i, t].repeat_interleave(group)) * y[i - t]
    return out


def dflash2_forward(w: dict[str, torch.Tensor], embed: torch.Tensor, head: torch.Tensor, aux: torch.Tensor,
                    block_ids: torch.Tensor, multiplier: float) -> tuple[torch.Tensor, list[int]]:
    """z-lab's DFlash2 block and greedy selector walk, written from its definition: DFlash's block layer with each
    sublayer wrapped (kernels from the sublayer input: conv with base[0] + d[0] before, base[1] + d[1] after);
    unary logits u = m · head(h), h the normed output; slot i picks argmax_c u_i[c] + <P[prev] * W h_i, S[c]> over
    the top-16 of u_i, prev = the anchor, then the previous pick. -> (u [B, V], the picks of slots 1..B-1)."""
    c = _rms(aux @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = embed[block_ids]
    t, b = aux.shape[0], block_ids.shape[0]
    pos_ctx, pos_blk = torch.arange(t), torch.arange(t, t + b)
    for i in range(2):
        p = f"layers.{i}."

        def kernels(y: torch.Tensor, conv: str, p=p) -> torch.Tensor:
            return (y @ w[p + conv + ".kernel_projection.weight"].T).view(b, 2, -1, H // 16)

        xn = _rms(x, w[p + "input_layernorm.weight"])
        d = kernels(xn, "attention_conv")
        base = w[p + "attention_conv.base_kernel"]
        a = _conv(xn, d[:, 0], base[0])
        wq, wk, wv = (w[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        q = _rope(_rms(_heads(a @ wq.T, NH), w[p + "self_attn.q_norm.weight"]), pos_blk, 1000000.0)
        k = _rope(_rms(_heads(torch.cat([c @ wk.T, a @ wk.T]), NKV), w[p + "self_attn.k_norm.weight"]),
                  torch.cat([pos_ctx, pos_blk]), 1000000.0)
        v = _heads(torch.cat([c @ wv.T, a @ wv.T]), NKV)
        o = _attend(q, k, v, torch.ones(b, t + b, dtype=torch.bool)) @ w[p + "self_attn.o_proj.weight"].T
        x = x + _conv(o, d[:, 1], base[1])
        mn = _rms(x, w[p + "post_attention_layernorm.weight"])
        d, base = kernels(mn, "mlp_conv"), w[p + "mlp_conv.base_kernel"]
        x = x + _conv(_mlp(_conv(mn, d[:, 0], base[0]), w, p), d[:, 1], base[1])
    h = _rms(x, w["norm.weight"])
    u = multiplier * (h @ head.T)
    prev, picks = int(block_ids[0]), []
    for i in range(1, b):
        cand = u[i].topk(16).indices
        ctx = w["candidate_selector.predecessor_codebook.weight"][prev] * (w["candidate_selector.hidden_projection."
                                                                            "weight"] @ h[i])
        scores = u[i, cand] + w["candidate_selector.successor_codebook.weight"][cand] @ ctx
        prev = int(cand[scores.argmax()])
        picks.append(prev)
    return u, picks


def test_converted_dflash2_computes_the_published_forward(tmp_path, tiny_qwen3, tiny_targets):
    """z-lab's DFlash2 (Embedding-style codebook names, output_multiplier 0.5 folded into norm and the selector's
    projection): the same logits and the same greedy drafts as the published forward."""
    from safetensors.torch import load_file

    from engine.algos.loading import load_draft

    src = dflash2_zlab(tmp_path / "src", multiplier=0.5, codebook_suffix=".weight")
    draft = load_draft(convert(src, tmp_path / "out", verifier=str(tiny_targets["qwen3"])), tiny_qwen3)
    w = load_file(str(src / "model.safetensors"))
    torch.manual_seed(0)
    aux, block = torch.randn(6, 3 * H), torch.tensor([17, MASK, MASK, MASK])
    embed, head = tiny_qwen3.embed_tokens().weight.detach(), tiny_qwen3.lm_head().weight.detach()
    want, picks = dflash2_forward(w, embed, head, aux, block, 0.5)
    with torch.no_grad():
        x = _draft_block(draft, aux, block)
        got = draft.logits(x[0])
        drafted = draft.greedy_drafts(x[:, 1:], torch.tensor([17]))[0].tolist()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert drafted == picks


@pytest.mark.parametrize("key,value", [("final_logit_softcapping", 20.0), ("input_embedding_scale", 2.0)])
def test_dflash2_settings_the_speculators_format_cannot_carry_are_refused(tmp_path, key, value):
    src = dflash2_zlab(tmp_path / "src", extra={key: value})
    with pytest.raises(WorkbenchError, match=f"dflash_config.{key} is {value}") as info:
        convert(src, tmp_path / "out")
    assert "train --algo dflash2" in info.value.hint and not (tmp_path / "out").exists()


def test_same_tensors_and_config_as_speculators_eagle3_converter(tmp_path, tiny_targets):
    from safetensors.torch import load_file
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    src = specforge(tmp_path / "src")
    verifier = str(tiny_targets["llama"])
    ours = convert(src, tmp_path / "ours", verifier=verifier, aux_layer_ids=[1, 2, 3])
    Eagle3Converter().convert(src, tmp_path / "theirs", base_model=verifier, validate=False,
                              eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    a, b = load_file(str(ours / "model.safetensors")), load_file(str(tmp_path / "theirs" / "model.safetensors"))
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name].to(b[name].dtype), b[name]), name
    ca = json.loads((ours / "config.json").read_text())
    cb = json.loads((tmp_path / "theirs" / "config.json").read_text())
    for key in ("speculators_model_type", "draft_vocab_size", "norm_before_residual", "norm_before_fc", "fc_norm",
                "eagle_aux_hidden_state_layer_ids"):
        assert ca.get(key) == cb.get(key), key
    assert ca["speculators_config"]["verifier"] == cb["speculators_config"]["verifier"]
    assert ca["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    la, lb = ca["transformer_layer_config"], cb["transformer_layer_config"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_hidden_layers", "vocab_size", "rms_norm_eps", "max_position_embeddings", "rope_parameters"):
        assert la.get(key) == lb.get(key), key


def test_same_tensors_and_config_as_speculators_dflash_converter(tmp_path, tiny_targets):
    """speculators 0.9.0's DFlash converter on the same z-lab checkpoint: the same tensors (q/k/v split, gates
    dropped) and the same fields, but for the block attention we write on purpose."""
    from safetensors.torch import load_file
    from speculators.convert.dflash.converter import DFlashConverter

    src = dflash_zlab(tmp_path / "src")
    verifier = str(tiny_targets["qwen3"])
    ours = convert(src, tmp_path / "ours", verifier=verifier)
    DFlashConverter().convert(src, tmp_path / "theirs", base_model=verifier, validate=False)
    a, b = load_file(str(ours / "model.safetensors")), load_file(str(tmp_path / "theirs" / "model.safetensors"))
    assert set(a) == set(b) and "layers.1.self_attn.k_proj.weight" in a
    for name in a:
        assert torch.equal(a[name].to(b[name].dtype), b[name]), name
    ca = json.loads((ours / "config.json").read_text())
    cb = json.loads((tmp_path / "theirs" / "config.json").read_text())
    for key in ("speculators_model_type", "aux_hidden_state_layer_ids", "block_size", "mask_token_id",
                "draft_vocab_size", "sample_from_anchor", "target_hidden_size"):
        assert ca.get(key) == cb.get(key), key
    assert ca["speculators_config"]["verifier"] == cb["speculators_config"]["verifier"]
    assert ca["speculators_config"]["proposal_methods"] == cb["speculators_config"]["proposal_methods"]
    la, lb = ca["transformer_layer_config"], cb["transformer_layer_config"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_hidden_layers", "vocab_size", "rms_norm_eps", "model_type"):
        assert la.get(key) == lb.get(key), key
    # z-lab's blocks attend both ways; speculators writes sliding_window_non_causal false, which vLLM serves as a
    # causal block (dflash_config.causal = not sliding_window_non_causal): ours records the trained attention
    assert ca["sliding_window_non_causal"] is True and cb["sliding_window_non_causal"] is False


def _refusal_cases(fmt: str, state: dict[str, torch.Tensor]) -> dict[str, tuple[dict, str]]:
    """An extra, a missing and a wrong-shape tensor of a layout, with the line the refusal must show."""
    missing = "mask_hidden" if fmt.startswith("peagle-") else "markov_head.markov_w2.weight" \
        if fmt.startswith("dspark") else "layers.1.mlp_conv.base_kernel"
    return {"extra": ({**state, "fusion_bias": torch.ones(8)}, "fusion_bias [8]: no rule"),
            "missing": ({k: v for k, v in state.items() if k != missing}, missing),
            "shape": ({**state, "layers.1.mlp.down_proj.weight": torch.randn(H, FF + 1)},
                      "layers.1.mlp.down_proj.weight")}


@pytest.mark.parametrize("fmt", ["peagle-specforge", "peagle-aws", "dspark-deepspec", "dflash2-zlab"])
def test_new_layouts_refuse_unmapped_missing_and_wrong_shape_tensors(tmp_path, fmt):
    from safetensors.torch import load_file

    src = LAYOUTS[fmt](tmp_path / "src")
    state, config = load_file(str(src / "model.safetensors")), json.loads((src / "config.json").read_text())
    for case, (bad, expected) in _refusal_cases(fmt, state).items():
        folder = write_checkpoint(tmp_path / case, config, bad)
        for extra in src.glob("peagle_config.json"):
            (folder / extra.name).write_text(extra.read_text())
        with pytest.raises(WorkbenchError, match="do not all map") as info:
            convert(folder, tmp_path / f"out-{case}", aux_layer_ids=[1, 2, 3])
        assert expected in info.value.message, (case, info.value.message)
        assert not (tmp_path / f"out-{case}").exists()  # nothing written


def test_peagle_without_a_recorded_mask_token_asks_for_one(tmp_path):
    src = peagle_specforge(tmp_path / "src")
    (src / "peagle_config.json").unlink()  # a checkpoint copied without SpecForge's side file
    with pytest.raises(WorkbenchError, match="records no mask token") as info:
        plan(src, options=ConvertOptions(aux_layer_ids=[1, 2, 3]))
    assert "--mask-token-id" in info.value.hint
    p = plan(src, options=ConvertOptions(aux_layer_ids=[1, 2, 3], mask_token_id=7, speculative_tokens=5))
    assert p.config["mask_token_id"] == 7 and not p.problems
    assert p.config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    with pytest.raises(WorkbenchError, match="outside the vocabulary"):
        plan(src, options=ConvertOptions(mask_token_id=V))


def test_deepspec_dspark_refuses_a_verifier_it_was_not_trained_on(tmp_path):
    src = dspark_deepspec(tmp_path / "ds")
    for name, fields, message in (("narrow", {"hidden_size": 32}, "hidden size is 32"),
                                  ("shallow", {"num_hidden_layers": 2}, "do not fit a 2-layer verifier")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "hidden_size": H,
                                                        "num_hidden_layers": 4, "vocab_size": V, **fields}))
        with pytest.raises(WorkbenchError, match=message):
            plan(src, verifier=str(folder))


def test_specforge_peagle_records_the_plain_rope_its_model_applies(tmp_path):
    src = peagle_specforge(tmp_path / "sf")
    cfg = json.loads((src / "config.json").read_text())
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    (src / "config.json").write_text(json.dumps({**cfg, "rope_theta": 500000.0, "rope_scaling": scaling}))
    layer_config = plan(src, options=ConvertOptions(aux_layer_ids=[1, 2, 3])).config["transformer_layer_config"]
    rope = layer_config["rope_parameters"]
    assert rope["rope_type"] == "default" and rope["rope_theta"] == 500000.0


def test_recorded_aux_ids_are_translated_to_vllm_numbering(tmp_path):
    """SpecForge hooks the output of its eagle_config layers (vLLM id + 1); AWS/vLLM configs are read as they are;
    DeepSpec's -1 (the embeddings) is vLLM's 0."""
    src = peagle_specforge(tmp_path / "sf")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg,
                                                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}))
    assert plan(src).config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    src = peagle_aws(tmp_path / "aws")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    assert plan(src).config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    src = dspark_deepspec(tmp_path / "ds")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "target_layer_ids": [-1, 1, 2]}))
    assert plan(src).config["aux_hidden_state_layer_ids"] == [0, 2, 3]


def test_refuses_unmapped_missing_and_wrong_shape_tensors(tmp_path):
    src = safeailab(tmp_path / "src", pickled=False)
    from safetensors.torch import load_file

    state = load_file(str(src / "model.safetensors"))
    cases = {"extra": {**state, "fusion_bias": torch.ones(8)},
             "missing": {k: v for k, v in state.items() if k != "norm.weight"},
             "shape": {**state, "midlayer.mlp.down_proj.weight": torch.randn(H, FF + 1)}}
    expected = {"extra": "fusion_bias [8]: no rule", "missing": "norm.weight [64]: missing",
                "shape": "layers.0.mlp.down_proj.weight"}
    for case, bad in cases.items():
        folder = write_checkpoint(tmp_path / case, json.loads((src / "config.json").read_text()), bad)
        assert plan(folder).problems, case
        with pytest.raises(WorkbenchError, match="do not all map") as info:
            convert(folder, tmp_path / f"out-{case}")
        assert expected[case] in info.value.message
        assert not (tmp_path / f"out-{case}").exists()  # nothing written


def test_dry_run_shows_mapping_and_config_and_writes_nothing(tmp_path, capsys):
    from engine.cli import main

    src = modelopt(tmp_path / "src")
    out = tmp_path / "never"
    assert main(["convert", str(src), "--out", str(out), "--dry-run", "--json", "--target", "org/verifier"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["format"] == "eagle3-modelopt" and not shown["problems"] and not out.exists()
    row = next(r for r in shown["mapping"] if r["source"] == "midlayer.1.mlp.up_proj.weight")
    assert row["target"] == "layers.1.mlp.up_proj.weight" and row["shape"] == [FF, H] and row["dtype"] == "F32"
    assert shown["config"]["speculators_model_type"] == "eagle3"
    assert main(["convert", str(src), "--out", str(out), "--target", "org/verifier"]) == 0
    printed = capsys.readouterr().out
    assert "validate: OK" in printed and "not tried (the verifier is not on this machine)" in printed


def test_convert_cli_errors_cleanly(tmp_path):
    """A source that cannot be converted ends as `error: ... Fix: ...`, exit code 2, no traceback."""
    folder = write_checkpoint(tmp_path / "medusa", {"medusa_num_heads": 2},
                              {"medusa_head.0.0.linear.weight": torch.ones(2, 2)})
    run = subprocess.run([sys.executable, "-m", "engine", "convert", str(folder), "--out", str(tmp_path / "o")],
                         check=False, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "Medusa" in run.stderr and "Fix:" in run.stderr and "Traceback" not in run.stderr


def _unconvertible(tmp_path: Path) -> dict[str, Path]:
    out = {}
    eagle2 = {"fc.weight": torch.randn(H, 2 * H), "fc.bias": torch.zeros(H), "embed_tokens.weight": torch.randn(V, H),
              **layer_tensors("layers.0.", H, first=False)}
    out["eagle1-2"] = write_checkpoint(tmp_path / "eagle2", {"architectures": ["LlamaForCausalLM"], "hidden_size": H},
                                       eagle2)
    out["hass"] = write_checkpoint(tmp_path / "hass", {"architectures": ["LlamaForCausalLM"], "hidden_size": H},
                         {**eagle2, "hidden_layernorm.weight": torch.ones(H)})
    out["medusa"] = write_checkpoint(tmp_path / "medusa", {"medusa_num_heads": 2, "medusa_num_layers": 1},
                           {"medusa_head.0.0.linear.weight": torch.randn(H, H),
                            "medusa_head.0.1.weight": torch.randn(V, H)})
    out["mtp-native"] = write_checkpoint(tmp_path / "mtp",
                                         {"architectures": ["Qwen3NextForCausalLM"], "mtp_num_hidden_layers": 1},
                               {"mtp.fc.weight": torch.randn(H, 2 * H), "mtp.norm.weight": torch.ones(H)})
    out["modelopt-parallel-draft"] = modelopt(tmp_path / "parallel")
    cfg = json.loads((out["modelopt-parallel-draft"] / "config.json").read_text())
    cfg["eagle_config"]["parallel_draft_step"] = 3
    (out["modelopt-parallel-draft"] / "config.json").write_text(json.dumps(cfg))
    for kind in ("mtp", "xpress", "eagle"):
        out[f"speculators-{kind}"] = write_checkpoint(tmp_path / f"spec-{kind}", {"speculators_model_type": kind},
                                                      {"x": torch.ones(1)})
    return out


def test_layouts_that_cannot_be_converted_say_what_why_and_instead(tmp_path):
    for expected, folder in _unconvertible(tmp_path).items():
        det = detect(folder)
        fmt = "speculators-unsupported" if expected.startswith("speculators-") else expected
        assert (det.kind, det.format) == ("not-convertible", fmt), expected
        assert det.why and det.instead
        with pytest.raises(WorkbenchError) as info:
            convert(folder, tmp_path / f"out-{expected}")
        assert det.why in info.value.message and info.value.hint == det.instead
    assert "serve them natively" in detect(tmp_path / "mtp").instead
    assert "`xpress`" in detect(tmp_path / "spec-xpress").title and "0.33" in detect(tmp_path / "spec-xpress").why


def test_inputs_single_file_shards_zip_and_pickle(tmp_path):
    src = safeailab(tmp_path / "src", pickled=False)
    # one .safetensors file, named directly
    assert detect(src / "model.safetensors").format == "eagle3-safeailab"
    # sharded safetensors with an index
    from safetensors.torch import load_file

    state = load_file(str(src / "model.safetensors"))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((src / "config.json").read_text())
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(sharded / file))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in halves.items() for k in keys}}))
    assert validate_draft(convert(sharded, tmp_path / "from-shards")).ok
    # a zip (wrapped in a sub-folder) is extracted under the staging folder; '..' members are refused
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in src.iterdir():
            zf.write(f, f"ckpt/{f.name}")
    (tmp_path / "ok.zip").write_bytes(buf.getvalue())
    from engine.convert.inputs import open_source

    staged = open_source(tmp_path / "ok.zip", staging=tmp_path / "staging")
    assert staged.folder.name == "ckpt" and detect(staged.folder).format == "eagle3-safeailab"
    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("../evil.json", "{}")
    (tmp_path / "bad.zip").write_bytes(bad.getvalue())
    with pytest.raises(WorkbenchError, match="unsafe paths"):
        open_source(tmp_path / "bad.zip", staging=tmp_path / "staging")
    assert not (tmp_path / "evil.json").exists()
    # pickles: only with the allow flag, weights_only, and a clear message when the file holds objects
    pickled = safeailab(tmp_path / "pickled")
    with pytest.raises(WorkbenchError, match="unpickling"):
        convert(pickled, tmp_path / "p-out")
    assert validate_draft(convert(pickled, tmp_path / "p-out", allow_pickle=True)).ok
    torch.save({"state": state, "opt": ConvertOptions()}, pickled / "pytorch_model.bin")
    with pytest.raises(WorkbenchError, match="refused to unpickle: the file holds Python objects"):
        convert(pickled, tmp_path / "p-out2", allow_pickle=True)


def test_mapping_table_and_options(tmp_path):
    src = dflash_zlab(tmp_path / "src")
    table = dict(mapping_table(src))
    assert table["layers.0.self_attn.g_proj.weight"] is None
    assert table["layers.1.self_attn.qkv_proj.weight"] == "layers.1.self_attn.qkv_proj.weight"  # split afterwards
    p = plan(src, options=ConvertOptions(mask_token_id=7, aux_layer_ids=[1, 3, 4]))
    assert p.config["mask_token_id"] == 7 and p.config["aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert p.state["layers.1.self_attn.k_proj.weight"].shape == (NKV * HD, H)
