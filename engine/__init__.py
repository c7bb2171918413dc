"""Speculators Workbench engine: data, training, format, conversion and generation for draft models."""

__version__ = "0.1.0"
