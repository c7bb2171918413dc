"""Tiny random targets of every family transformers builds offline, with a small ChatML tokenizer, for the tests."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.fsutil import atomic_directory, atomic_write_json

CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test assistant<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small draft model propose tokens that a target model verifies.",
    "Hello, how are you today? I am fine, thank you. What can I help you with?",
    "def add(a, b):\n    return a + b\n",
    "1 2 3 4 5 6 7 8 9 10, the numbers go on and on.",
    "user assistant system: answer the question with a short and helpful reply.",
]
ARCHS = ("llama", "qwen3", "qwen3_moe")
# Gated DeltaNet layers every other layer, head sizes of 128 as published (the vLLM CPU build's kernel takes no other)
_GATED_DELTANET = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=128,
                       linear_value_head_dim=128, full_attention_interval=2)
_SHARED_EXPERT_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=32)
# model_type -> config fields beyond the common ones; every family a tiny random target is built of (tests/engine/
# test_families.py runs each through extract -> train -> validate -> evaluate -> lossless generation)
FAMILIES: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1),
    "mistral": dict(sliding_window=8),
    "gemma2": dict(sliding_window=8, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),  # tied, as Gemma ships
    "gemma3_text": dict(sliding_window=8, sliding_window_pattern=2, hidden_activation="gelu_pytorch_tanh",
                        tie_word_embeddings=True),
    "phi3": {},
    "olmo2": {},
    "granite": dict(embedding_multiplier=4.0, logits_scaling=2.0, residual_multiplier=0.5, attention_multiplier=0.25),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    # 2025-26 families: Gemma 4 (sliding and global layers, the global ones with their own head size), dense and MoE
    "gemma4_text": dict(sliding_window=8, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                        hidden_size_per_layer_input=0, global_head_dim=32),
    "gemma4_text:moe": dict(sliding_window=8, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                            hidden_size_per_layer_input=0, global_head_dim=32, enable_moe_block=True, num_experts=4,
                            top_k_experts=2, moe_intermediate_size=32),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                     n_group=1, topk_group=1, n_shared_experts=1),
    "seed_oss": {},
    "llama4_text": dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128),
    # Gated DeltaNet (linear attention) layers between full attention ones: the runner rewinds their recurrent state
    "qwen3_next": dict(**_GATED_DELTANET, **_SHARED_EXPERT_MOE),
    "qwen3_5_text": dict(**_GATED_DELTANET),
    # MLA attention with as many KV heads as heads and the bias-corrected router, as DeepSeek-V3 ships
    # (vLLM's MLA takes a latent of kv_lora_rank + qk_rope_head_dim = 576, DeepSeek's own)
    "deepseek_v3": dict(num_key_value_heads=4, head_dim=64, kv_lora_rank=512, q_lora_rank=64, qk_rope_head_dim=64,
                        qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
                        topk_method="noaux_tc", scoring_func="sigmoid"),
    "qwen3_5_moe_text": dict(**_GATED_DELTANET, **_SHARED_EXPERT_MOE),
}


# Targets outside the end-to-end matrix, for the rollback guard (tests/engine/test_families.py): DeepSeek-V3 with
# fewer KV heads than heads (transformers' cached multi-token step crashes; DeepSeek ships as many as heads).
PROBE_FAMILIES: dict[str, dict] = {
    "deepseek_v3:gqa": dict(head_dim=8, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, n_group=1, topk_group=1),
}


def tiny_tokenizer(vocab_size: int = 384):
    """A byte-level BPE tokenizer trained in milliseconds, with ChatML specials at ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def tiny_config(arch: str = "llama", *, num_layers: int = 4, hidden_size: int = 64, vocab_size: int = 384,
                **overrides):
    """A transformers config for a tiny target of family `arch` (a model_type in FAMILIES)."""
    from transformers import AutoConfig, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return LlamaConfig(**common, architectures=["LlamaForCausalLM"])
    if arch == "qwen3":
        return Qwen3Config(**common, architectures=["Qwen3ForCausalLM"])
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=hidden_size,
            decoder_sparse_step=1,
            architectures=["Qwen3MoeForCausalLM"],
        )
    if arch in PROBE_FAMILIES:
        return AutoConfig.for_model(arch.split(":")[0], **{**common, **PROBE_FAMILIES[arch], **overrides})
    if overrides:
        raise ValueError(f"config overrides {sorted(overrides)} are only taken for {sorted(PROBE_FAMILIES)}")
    if arch in FAMILIES:
        extra = dict(FAMILIES[arch])
        if arch == "gemma3_text":
            extra["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
            extra.pop("sliding_window_pattern")
        if arch.startswith("gemma4_text"):
            extra["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
        if arch == "gpt_oss":
            extra["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
        config = AutoConfig.for_model(arch.split(":")[0], **{**common, **extra})  # "type:variant" keys
        config.architectures = [_ARCHITECTURES.get(arch, type(config).__name__.replace("Config", "ForCausalLM"))]
        return config
    raise ValueError(f"unknown tiny arch '{arch}', choose one of {sorted(FAMILIES)}")


_ARCHITECTURES = {"gemma3_text": "Gemma3ForCausalLM", "gpt_oss": "GptOssForCausalLM", "olmo2": "Olmo2ForCausalLM",
                  "gemma4_text": "Gemma4ForCausalLM", "gemma4_text:moe": "Gemma4ForCausalLM",
                  "llama4_text": "Llama4ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
                  "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}  # the names published checkpoints carry


def tiny_model(arch: str = "llama", *, seed: int = 0, **config_kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kw), dtype=torch.float32)
    # Larger-than-default init makes the random model's distributions peaky, like a trained one.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15 if "embed" in name or "lm_head" in name else 0.08)
    return model.eval()


def save_tiny_target(folder: str | Path, arch: str = "llama", *, seed: int = 0, **config_kw) -> Path:
    """Write a tiny random target as a normal HF folder (config, safetensors, tokenizer)."""
    folder = Path(folder)
    tokenizer = tiny_tokenizer(config_kw.get("vocab_size", 384))
    model = tiny_model(arch, seed=seed, **config_kw)
    with atomic_directory(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "workbench_target.json", {"name": f"tiny-{arch}", "hub_id": None, "seed": seed})
    return folder


def algo_flags(algo: str, wanted: dict[str, str]) -> list[str]:
    """`train` flags for the arguments of `wanted` that `algo` has (e.g. only block algorithms have block_size)."""
    from engine.algos import ALGOS

    fields = ALGOS.get(algo).args_class.model_fields
    return [x for name, value in wanted.items() if name in fields for x in (f"--{name.replace('_', '-')}", value)]
