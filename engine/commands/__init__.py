"""CLI commands: each module adds its arguments and runs one engine function."""
