"""KPI values as plain JSON: numpy scalars, paths, tuples and sets turned into JSON types."""

from __future__ import annotations

import json
from typing import Any


def json_default(value: Any) -> Any:
    """Return a JSON type for a value json.dumps cannot write (its `default=`): a numpy scalar's item, a list
    for a set or tuple, else the value's str (a path's text)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def json_safe(value: Any) -> Any:
    """Return value converted to plain JSON types (numpy scalars, paths, tuples)."""
    return json.loads(json.dumps(value, default=json_default, allow_nan=True))
