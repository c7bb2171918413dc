"""Training data: load and normalise conversations, render them with loss masks, regenerate answers with the
target, and extract the target's hidden states to vLLM-format safetensors files (or on the fly).

Modules: `sources` (raw records from files and the built-in ShareGPT), `datasets` (shapes, roles, splits:
`load_conversations`, `heldout_prompts`), `render` (chat template + assistant-only loss masks, previews),
`regenerate` (on-policy answers), `layers` (which layer ids to capture), `store` (the on-disk format and its
reader), `extract` (the transformers backend and the common driver), `vllm_backend` (vLLM's
`extract_hidden_states` path), `online` (hidden states computed while training).
"""
