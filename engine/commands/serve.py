"""Placeholder until the command lands."""
def add_arguments(p):
    pass
def run(args):
    raise SystemExit("not implemented yet")
