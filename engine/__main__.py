"""`python -m engine <command>`: the CLI that mirrors every page of the workbench."""

from engine.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
