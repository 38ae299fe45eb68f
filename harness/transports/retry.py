"""Bounded retries with exponential backoff for transient transport errors."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How often and how patiently an operation is retried.

    ``attempts`` counts every try, the first included; the wait before try k+1 is
    ``initial_s * factor**(k-1)``, capped at ``max_s``.
    """

    attempts: int = 3
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 4.0

    def delays_s(self) -> list[float]:
        """Return the waits before the 2nd, 3rd, ... try (attempts - 1 values)."""
        return [min(self.max_s, self.initial_s * self.factor ** k) for k in range(max(0, self.attempts - 1))]


def retry_call(fn: Callable[[], T], *, backoff: Backoff, retry_on: tuple[type[BaseException], ...],
               on_retry: Callable[[int, BaseException], None] | None = None,
               sleep: Callable[[float], None] = time.sleep, what: str = "operation") -> T:
    """Return fn()'s result, calling it again after a retry_on exception, at most backoff.attempts times.

    on_retry(attempt, error) runs before each new try (after the wait), e.g. to reconnect; an
    exception it raises that is in retry_on counts as that try failing. The last error is re-raised.
    """
    delays = backoff.delays_s()
    attempt = 1
    last: BaseException | None = None
    while True:
        try:
            if last is not None and on_retry is not None:
                on_retry(attempt, last)
            return fn()
        except retry_on as e:
            last = e
            if attempt >= backoff.attempts:
                raise
            delay_s = delays[attempt - 1]
            logger.warning("%s failed (try %d of %d): %s; retrying in %.1f s",
                           what, attempt, backoff.attempts, _first_line(e), delay_s)
            sleep(delay_s)
            attempt += 1


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__
