"""Training data, one subpackage per stage: `render` (conversations to token ids with loss masks), `prompts` (prompt
sets for measurement), `answers` (the target's own answers), `extract` (its hidden states), `store` (their files)."""

# Beside them: `options` (the typed options of prepare, regenerate, extract and check) and `plan` (what a target is
# and what an extraction and a training run for it will cost). A dataset travels render.chat -> extract.dataset
# (through extract.run, and extract.vllm for vLLM's backend) -> store.files, which training reads.
