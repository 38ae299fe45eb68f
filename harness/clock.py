"""Wall-clock time as the harness records it: UTC, ISO 8601, whole seconds."""

from __future__ import annotations

import datetime as dt


def utc_now() -> dt.datetime:
    """Return the current UTC time, to the second."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def now_iso() -> str:
    """Return the current UTC time as ISO 8601 (seconds)."""
    return utc_now().isoformat()
