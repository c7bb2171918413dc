"""Training data: load and normalise conversations, render them with loss masks, regenerate answers with the
target, and extract the target's hidden states to vLLM-format safetensors files (or on the fly)."""

# Modules: `sources` (raw records from files and the built-in ShareGPT), `datasets` (shapes, roles, splits:
# `load_conversations`, `heldout_prompts`), `prompts` (prompts for benchmarks and evaluation), `render` (chat
# template + assistant-only loss masks, previews), `regenerate` (on-policy answers; `regenerate_vllm` through a
# vLLM server, `regenerate_dataset` the step the CLI, app and recipes run), `layer_ids` (which layer ids to
# capture), `store` (the on-disk format and its reader), `extract` (the driver and the transformers backend),
# `extraction_run` (what both extraction backends share: manifest header, resumable run, disk checks),
# `vllm_backend` (vLLM's `extract_hidden_states` path, in this process or as a worker in vLLM's own
# environment: `vllm_side/workbench_hs_worker.py`), `online` (hidden states computed while training).
