"""Real vLLM, run from its own virtual environment and driven over HTTP: install, serve, query, benchmark."""
