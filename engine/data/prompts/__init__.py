"""Prompt sets for benchmarks and evaluation: prompt files, the built-in workloads and held-out splits."""
