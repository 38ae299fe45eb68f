"""Plain-text formatting of KPI values for the sign-off page: numbers to 4 significant digits, nested dicts
and lists compactly on one line (latency_ms as 'p50 2.61 · p90 4.97 · ...'), times and durations."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from harness.steps.table import find
from harness.reasons import headline as cut

_PYTEST_PREFIX = re.compile(r"^(Failed|Skipped|XFailed): ")
MAX_ITEMS = 6
COMPARE_DIGITS = 6  # baseline comparisons: 0.999999 against 0.999909 must not both read 1
MAX_TEXT = 140

_SKIP = {"telemetry", "verdicts", "intervals"}
MAX_GENERIC_KPIS = 12


def main_kpis(step: str, kpis: dict[str, Any]) -> list[tuple[str, Any]]:
    """Return the (name, value) pairs to show for a step: its headline KPIs (the step table's page_kpis), else
    its scalar KPIs."""
    declared = find(step)
    names = declared.page_kpis if declared is not None else None
    if names is not None:
        return [(k, kpis[k]) for k in names if k in kpis]
    scalars = [(k, v) for k, v in kpis.items() if k not in _SKIP and not isinstance(v, (dict, list))]
    return scalars[:MAX_GENERIC_KPIS]


def number(value: float | int, digits: int = 4) -> str:
    """Return a number as text: integers with thousands separators, floats to `digits` significant digits."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if value != value:  # NaN
        return "NaN"
    if abs(value) >= 1e5:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def value_text(value: Any, depth: int = 0, digits: int = 4) -> str:
    """Return a KPI value on one line: dicts as 'key value · key value', lists joined, None as '—'."""
    if value is None:
        return "—"
    if isinstance(value, (bool, int, float)):
        return number(value, digits)
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT - 1] + "…"
    if isinstance(value, dict):
        return _dict_text(value, depth)
    if isinstance(value, (list, tuple)):
        return _list_text(list(value), depth)
    return str(value)


def _dict_text(value: dict[str, Any], depth: int) -> str:
    if not value:
        return "none"
    if depth > 0:
        return "{…}"
    items = list(value.items())
    text = " · ".join(f"{k} {value_text(v, depth + 1)}" for k, v in items[:MAX_ITEMS + 2])
    return text + (f" · … (+{len(items) - MAX_ITEMS - 2})" if len(items) > MAX_ITEMS + 2 else "")


def _list_text(items: list[Any], depth: int) -> str:
    if not items:
        return "none"
    shown = [_item_text(x, depth) for x in items[:MAX_ITEMS]]
    more = f", … (+{len(items) - MAX_ITEMS})" if len(items) > MAX_ITEMS else ""
    return ", ".join(shown) + more


def _item_text(item: Any, depth: int) -> str:
    """A list element: a dict naming a node/tensor/candidate by its name (and op type and share), else its text."""
    if not isinstance(item, dict):
        return value_text(item, depth + 1)
    label = item.get("node") or item.get("name") or item.get("tensor") or item.get("zone")
    if label is None:
        return "{…}"
    text = str(label)
    if item.get("op_type"):
        text += f" ({item['op_type']})"
    if isinstance(item.get("share"), (int, float)):
        text += f" {item['share']:.0%}"
    return text


def headline(message: str) -> str:
    """Return a step message's headline: its first line, under 200 characters (harness.reasons.headline); a
    line ending in ':' (an older run's 'ptq did not pass:') takes the next lines along."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if not lines:
        return ""
    lines[0] = _PYTEST_PREFIX.sub("", lines[0])  # pytest's 'Failed: ' of pytest.fail messages
    if lines[0].endswith(":") and len(lines) > 1:
        return cut(f"{lines[0]} {'; '.join(lines[1:4])}")
    return cut(lines[0])


def details(message: str) -> str:
    """Return what a step message says beyond its headline ('' when the headline is all of it)."""
    text = message_text(message)
    return "" if headline(text) == text else text


def message_text(message: str) -> str:
    """Return a step message without pytest's 'Failed: ' prefix and blank lines."""
    lines = [line.rstrip() for line in (message or "").strip().splitlines() if line.strip()]
    if lines:
        lines[0] = _PYTEST_PREFIX.sub("", lines[0])
    return "\n".join(lines)


def when(iso: str | None) -> str:
    """Return an ISO 8601 time as 'YYYY-MM-DD HH:MM:SS UTC' (the text as given when it does not parse)."""
    if not iso:
        return "—"
    try:
        t = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return str(iso)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: Any) -> str:
    """Return a duration in seconds as '4 min 55 s' (or '—')."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return (f"{h} h " if h else "") + f"{m} min {s} s"


def signed(value: Any, pct: bool = False) -> str:
    """Return a delta with its sign ('+0.2', '-3.1%'), '—' for a missing one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    return f"{value:+.1f}%" if pct else ("+" if value > 0 else "") + number(value, COMPARE_DIGITS)
