"""``baton reproduce``'s terminal table: one line per claim with its numbers, and what the
claim is about written under it, so rows never wrap into columns of prose."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

INDENT = "    "


@dataclass(frozen=True, slots=True)
class ClaimLine:
    """One claim as the terminal shows it: name, the paper's change, Baton's with its
    interval, the verdict in one or two words, and a description (figure, metric, details)."""

    name: str
    paper: str
    baton: str
    verdict: str
    description: str


HEAD = ClaimLine("figure", "paper", "Baton [95% CI]", "verdict", "")


def claim_lines(claims: list[ClaimLine], width: int) -> list[tuple[str, bool]]:
    """The table as ``(text, is_description)`` lines of at most ``width`` characters (a
    name longer than the width is the only exception): numbers right-aligned, words
    left-aligned; a name too long to share its line with the numbers gets its own line."""
    rows = [HEAD, *claims]
    wp, wb, wv = (max(len(getattr(c, k)) for c in rows) for k in ("paper", "baton", "verdict"))
    wn = max(len(c.name) for c in rows)
    numbers_w = wp + 2 + wb + 2 + wv
    together = wn + 2 + numbers_w <= width
    out: list[tuple[str, bool]] = []
    for c in rows:
        numbers = f"{c.paper:>{wp}}  {c.baton:>{wb}}  {c.verdict:<{wv}}".rstrip()
        if together:
            out.append((f"{c.name:<{wn}}  {numbers}".rstrip(), False))
        else:
            out += [(c.name, False), (INDENT + numbers, False)]
        if c.description:
            out += [(line, True) for line in textwrap.wrap(c.description, width, initial_indent=INDENT,
                                                            subsequent_indent=INDENT)]
    return out
