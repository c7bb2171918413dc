"""One meaning per colour, on every page: token sources, the trained span, methods in charts, time split."""

# Green means an accepted draft token (Demo chat, acceptance charts); the trained (loss-masked) span of a data
# row is a yellow highlighter, never green; methods keep one colour in every chart; status badges use
# Streamlit's named colours (green = passes/done, orange = warning/differs, red = fails). Training charts: one
# colour per run (the first run in slate blue), the split as the line style (training solid, validation dotted),
# draft positions as a ramp of the run's colour, the decoding walk (what decoding will accept) in the accepted
# green and the shipped draft's own curve in the draft's purple.

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

# heat maps of acceptance: none at all grey, then the accepted green from a visible tint at the first percent
ACCEPTED_SCALE = [[0, "#eeeeee"], [0.001, "#d9f0d3"], [0.3, "#7fbf7b"], [1, ACCEPTED_BAR]]

TIME_SPLIT = {"target verification": "#5b6b7d", "drafting": "#a98bd6", "the rest": "#d9d9d9"}


def method_colour(name: str, i: int = 0) -> str:
    return METHODS.get(name) or _EXTRA[i % len(_EXTRA)]


RUNS = ["#3b6fb6", "#d08c2a", "#5a7d2a", "#b04a4a", "#6d6d6d", "#1f8a8a"]  # training runs, in the order shown
SPLIT_DASH = {"train": None, "val": "dot"}
WALK = ACCEPTED_BAR  # the decoding walk's acceptance length: what greedy decoding will accept
SHIPPED = METHODS["draft"]  # the shipped draft's own curve, beside your runs


def run_colour(i: int) -> str:
    return RUNS[i % len(RUNS)]


def position_colour(base: str, position: int, positions: int) -> str:
    """Draft position `position` (0-based) of `positions` as a ramp of `base`: the first one full, later ones
    blended towards white (position 0 is the draft's first token, the one accepted most often)."""
    mix = 0.65 * position / max(1, positions - 1) if positions > 1 else 0.0
    r, g, b = (int(base[i:i + 2], 16) for i in (1, 3, 5))
    r, g, b = (round(c + (255 - c) * mix) for c in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"
