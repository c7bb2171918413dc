"""One meaning per colour, on every page: token sources, the trained span, methods in charts, time split.

Green means an accepted draft token (Demo chat, acceptance charts); the trained (loss-masked) span of a data
row is a yellow highlighter, never green; methods keep one colour in every chart; status badges use
Streamlit's named colours (green = passes/done, orange = warning/differs, red = fails).
"""

from __future__ import annotations

ACCEPTED = "#b7ebc0"      # accepted draft token (background)
ACCEPTED_BAR = "#4c9f70"  # the same meaning in charts (acceptance length, acceptance per position)
CORRECTION = "#ffd3a8"    # the target's token at the first rejected position
BONUS = "#b9d7ff"         # the target's extra token when every draft was accepted
REJECTED = "#c0392b"      # rejected drafts (dotted underline)
TRAINED = "#fdeaa0"       # the loss-masked (trained) span of a data row
TRAINED_TEXT = "#4a3a00"
UNTRAINED_TEXT = "#6b6b6b"
REFERENCE = "#999999"     # reference lines (baseline = 1×, k+1)
CEILING = "#333333"       # the speedup ceiling marker

METHODS = {"baseline": "#8c8c8c", "draft": "#7b4fc9", "draft_2": "#c2549d", "ngram": "#1f8a8a",
           "hf_prompt_lookup": "#d08c2a", "hf_assisted": "#8c6d31"}
_EXTRA = ["#3b6fb6", "#b04a4a", "#5a7d2a", "#6d6d6d"]

TIME_SPLIT = {"target verification": "#5b6b7d", "drafting": "#a98bd6", "the rest": "#d9d9d9"}


def method_colour(name: str, i: int = 0) -> str:
    return METHODS.get(name) or _EXTRA[i % len(_EXTRA)]
