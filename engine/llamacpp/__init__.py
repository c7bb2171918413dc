"""llama.cpp, the engine CPU users decode with: its build, GGUF export of drafts and targets, and its server."""
