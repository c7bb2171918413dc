"""Measurement above training and generation: evaluation, benchmarks, step costs, and the stored target answers."""
