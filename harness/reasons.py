"""Readable reasons: every failure or inconclusive result as a one-line headline (under 200 characters:
what failed, the value, the rule) over its details, so the terminal, the run summary and the sign-off
page can show the headline and keep the details one `-v` or one click away."""

from __future__ import annotations

import re

MAX_HEADLINE = 199
_BREAK = re.compile(r"[.;](?=\s)")  # a sentence or clause ends here


def headline(text: str, limit: int = MAX_HEADLINE) -> str:
    """Return the first non-blank line of text, cut to at most limit characters: at the last sentence or
    clause end that fits when there is one past a third of the limit, else at a word, with '…'."""
    first = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    if len(first) <= limit:
        return first
    ends = [m.start() + 1 for m in _BREAK.finditer(first) if m.start() + 1 <= limit]
    if ends and ends[-1] > limit // 3:
        return first[:ends[-1]].rstrip(".;") + " …"
    cut = first[:limit - 2]
    cut = cut[:cut.rfind(" ")] if " " in cut[limit // 2:] else cut
    return cut.rstrip(" ,;:") + " …"


def details(text: str) -> str:
    """Return what a message says beyond its headline ('' when the headline is all of it)."""
    lines = [line.rstrip() for line in (text or "").strip().splitlines()]
    if not lines:
        return ""
    rest = "\n".join(lines[1:]).strip("\n")
    return text.strip() if headline(lines[0]) != lines[0].strip() else rest


def summarize(prefix: str, reasons: list[str], limit: int = MAX_HEADLINE) -> str:
    """Return '<prefix>: <headline of the first reason> (+N more)' within limit characters, then one line per
    reason in full ('  - reason'): a message whose first line is its headline."""
    if not reasons:
        return prefix
    more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
    head = f"{prefix}: {headline(reasons[0], max(40, limit - len(prefix) - 2 - len(more)))}{more}"
    if len(reasons) == 1 and headline(reasons[0]) == reasons[0].strip():
        return head
    body = "\n".join("  - " + r.strip().replace("\n", "\n    ") for r in reasons)
    return f"{head}\n{body}"
