"""The on-disk hidden-states format (vLLM's files plus a manifest), its reader, and the checks of its files."""
