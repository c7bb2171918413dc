"""Helpers shared by the test modules (fixtures live in conftest.py); no test module imports another."""
