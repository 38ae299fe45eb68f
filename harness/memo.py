"""Per-instance memoisation of the pipeline's artifacts and step reports."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def memoized(method: Callable[[Any], T]) -> Callable[[Any], T]:
    """Cache a method's result, or the exception it raised, per instance (in the instance's `_memo` dict)."""
    @functools.wraps(method)
    def wrapper(self: Any) -> T:
        memo = self._memo
        if method.__name__ not in memo:
            try:
                memo[method.__name__] = (True, method(self))
            except Exception as e:  # re-raised below, and on every later call
                memo[method.__name__] = (False, e)
        ok, value = memo[method.__name__]
        if not ok:
            raise value
        return value
    return wrapper
