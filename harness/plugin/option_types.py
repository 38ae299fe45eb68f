"""argparse `type=` parsers for the plugin's numeric options: a bad value is a usage error."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def bounded(kind: type, minimum: float, what: str) -> Callable[[str], float]:
    """Return a parser turning text into a finite kind (int or float) >= minimum.

    Anything else raises argparse.ArgumentTypeError("'TEXT' is not WHAT"), which pytest reports
    as a usage error naming the option.
    """
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"'{text}' is not {what}")
        return value

    parse.__name__ = what.replace(" ", "_")
    return parse


seconds = bounded(float, 0, "a duration in seconds (0 or more)")
positive_seconds = bounded(float, 1e-9, "a duration in seconds (more than 0)")
