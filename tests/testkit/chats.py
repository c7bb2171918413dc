"""Small chats with multi-turn, single-turn and short answers, for the regeneration and one-pass tests."""

CHATS = [
    {"id": "multi", "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hello, how are you today?"},
                                 {"role": "assistant", "content": "ORIGINAL ANSWER ONE"},
                                 {"role": "user", "content": "What can I help you with?"},
                                 {"role": "assistant", "content": "ORIGINAL ANSWER TWO"}]},
    {"id": "single", "messages": [{"role": "user", "content": "The quick brown fox?"},
                                  {"role": "assistant", "content": "ORIGINAL"}]},
    {"id": "third", "messages": [{"role": "user", "content": "1 2 3 4 5"}, {"role": "assistant", "content": "6"}]},
]
