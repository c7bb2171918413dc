"""Targets (verifiers), one module per job: where they live, loading and dtypes, hidden-state capture, the verifier
tensors a draft shares, and the identity data and drafts record."""
