"""HTML views of token streams: speculative tokens coloured by source, and training rows with loss-masked spans."""

from __future__ import annotations

import html
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from ui import palette

# source -> (background colour, what it means)
SOURCES = {
    "accepted": (palette.ACCEPTED, "accepted draft token"),
    "correction": (palette.CORRECTION, "target correction (first rejected position)"),
    "bonus": (palette.BONUS, "bonus token (every draft token was accepted)"),
    "target": ("transparent", "target token (the first token, or a step that drafted nothing)"),
}
_BOX = "white-space:pre-wrap;line-height:1.75;font-size:0.95rem;font-family:ui-sans-serif,system-ui,sans-serif;"


@dataclass
class TokenText:
    """Incremental decoding that gives every token its exact piece of the final text (multi-byte safe)."""

    tokenizer: object
    ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)

    def add(self, token: int) -> str:
        before = "".join(self.pieces)
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        common = len(os.path.commonprefix([before, text]))
        excess = len(before) - common
        i = len(self.pieces) - 1
        while excess > 0 and i >= 0:  # a previous piece ended inside a multi-byte character: trim it
            cut = min(excess, len(self.pieces[i]))
            self.pieces[i] = self.pieces[i][: len(self.pieces[i]) - cut]
            excess -= cut
            i -= 1
        self.pieces.append(text[common:])
        return self.pieces[-1]

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass
class TokenMark:
    """One emitted token: its text piece, its source, its step, and the drafts rejected at that step."""

    piece: str
    source: str
    step: int
    rejected: list[str] = field(default_factory=list)


_NEWLINE = '<span class="tok-nl" style="opacity:0.45;user-select:none">↵</span>'


def _span(mark: TokenMark) -> str:
    """A coloured span per token; newlines stay outside the coloured box (no stray bars at line ends)."""
    colour, meaning = SOURCES.get(mark.source, SOURCES["target"])
    title = f"step {mark.step} · {meaning}"
    style = f"background:{colour};border-radius:3px;padding:0 1px;"
    if mark.rejected:
        title += " · rejected drafts: " + " ".join(repr(r) for r in mark.rejected)
        style += f"text-decoration:underline dotted {palette.REJECTED};text-underline-offset:3px;"
    attrs = (f'class="tok tok-{html.escape(mark.source)}" data-step="{mark.step}" title="{html.escape(title)}" '
             f'style="{style}"')
    lines = mark.piece.split("\n")
    if not any(lines):  # a token made of newlines only: a faint ↵ keeps it visible and hoverable
        return f"<span {attrs}>{_NEWLINE}</span>" + "\n" * (len(lines) - 1)
    return "\n".join(f"<span {attrs}>{html.escape(line)}</span>" if line else "" for line in lines)


def spec_html(marks: Iterable[TokenMark], *, cursor: bool = False) -> str:
    """The answer, a coloured span per token; newline tokens at its very end are plain line breaks (no ↵), as the
    baseline's text shows them."""
    marks = list(marks)
    end = len(marks)
    while end and not marks[end - 1].piece.strip("\n"):
        end -= 1
    body = "".join(_span(m) for m in marks[:end]) + "".join(m.piece for m in marks[end:])
    return f'<div class="spec-answer" style="{_BOX}">{body}{"▌" if cursor else ""}</div>'


def plain_html(text: str, *, cursor: bool = False, css_class: str = "baseline-answer") -> str:
    return f'<div class="{css_class}" style="{_BOX}">{html.escape(text)}{"▌" if cursor else ""}</div>'


def waiting_html(elapsed_s: float, *, started: bool = False) -> str:
    """Where an answer will appear, before its first token: an hourglass and the time waited so far."""
    what = "waiting for the next token" if started else "waiting for the first token (prefill)"
    return (f'<div class="answer-waiting" style="{_BOX}color:#6b6b6b">⏳ {what} · {elapsed_s:.0f} s</div>')


def legend_html() -> str:
    """What each token colour means, uncoloured target tokens and the rejected-drafts underline included."""
    chips = "".join(f'<span style="background:{c};border:1px solid #ccc;border-radius:3px;padding:0 6px;'
                    f'margin-right:10px">{html.escape(m.split(" (")[0])}</span>'
                    for s, (c, m) in SOURCES.items() if s != "target")
    plain = (f'<span class="legend-target" style="border:1px solid #ccc;border-radius:3px;padding:0 6px">no colour'
             f'</span>: {html.escape(SOURCES["target"][1])}; ')
    return (f'<div style="font-size:0.85rem">{chips}{plain}<span style="text-decoration:underline dotted '
            f'{palette.REJECTED}">dotted underline</span>: drafts were rejected here (hover to see them)</div>')


def loss_html(segments: Iterable[tuple[str, bool]], *, max_chars: int | None = None) -> str:
    """A rendered training row: loss-masked (trained) spans highlighted, the rest greyed."""
    out, used = [], 0
    for text, is_loss in segments:
        if max_chars is not None and used >= max_chars:
            out.append('<span style="color:#999">[…]</span>')
            break
        if max_chars is not None:
            text = text[: max_chars - used]
        used += len(text)
        style = (f"background:{palette.TRAINED};color:{palette.TRAINED_TEXT};border-radius:3px" if is_loss
                 else f"color:{palette.UNTRAINED_TEXT}")
        out.append(f'<span class="{"loss" if is_loss else "noloss"}" style="{style}">{html.escape(text)}</span>')
    return (f'<div class="loss-preview" style="{_BOX}font-family:ui-monospace,monospace;font-size:0.85rem;'
            f'border:1px solid #e5e5e5;border-radius:6px;padding:8px">{"".join(out)}</div>')
