"""Conversations to token ids: raw records read, normalised and split, rendered with the chat template and loss
masks."""
