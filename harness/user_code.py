"""User functions named in a model spec (`rewrites:`, `evaluation:`): 'package.module:function' or
'path/to/file.py:function', a file path taken relative to the spec's folder."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Callable

from harness.errors import ConfigError


def is_reference(text: str) -> bool:
    """True when text has the form of a function reference ('module:function' or 'file.py:function')."""
    target, sep, attr = text.rpartition(":")
    return bool(sep and target and attr)


def spec_relative(reference: str, spec_dir: Path) -> str:
    """Return a 'file.py:fn' reference with the file resolved against the spec's folder (others unchanged)."""
    target, sep, attr = reference.rpartition(":")
    if sep and target.endswith(".py") and not Path(target).expanduser().is_absolute():
        return f"{(spec_dir / target).resolve()}:{attr}"
    return reference


def load_function(reference: str, role: str, expected: str = "") -> Callable:
    """Return the function reference names; raises ConfigError starting "<role> '<reference>'" when it is
    malformed (the message then offers `expected`), cannot be imported, or names no function."""
    target, sep, attr = reference.rpartition(":")
    if not is_reference(reference):
        raise ConfigError(f"{role} '{reference}': expected 'package.module:function', 'path/to/file.py:function'"
                          f"{' or ' + expected if expected else ''}")
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser()
            if not path.is_file():
                raise ConfigError(f"{role} '{reference}': no such file {path}")
            spec = importlib.util.spec_from_file_location(f"harness_user_{role.replace(' ', '_')}_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ConfigError:
        raise
    except Exception as e:  # ImportError, SyntaxError, whatever the module raises at import
        raise ConfigError(f"{role} '{reference}': cannot import {target}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{role} '{reference}': {target} has no function '{attr}'")
    return fn
