"""Tiny random targets (Llama, Qwen3, Qwen3-MoE) with a small ChatML tokenizer, for the tests."""

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


def tiny_config(arch: str = "llama", *, num_layers: int = 4, hidden_size: int = 64, vocab_size: int = 384):
    """A transformers config for a tiny target of family `arch` ("llama", "qwen3" or "qwen3_moe")."""
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

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
    raise ValueError(f"unknown tiny arch '{arch}', choose one of {ARCHS}")


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
