"""The target's own answers: conversations regenerated in process, in one pass with their hidden states, or through
vLLM (`dataset.regenerate_dataset` picks), and those kept in the repository."""
