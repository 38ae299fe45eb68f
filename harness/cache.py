"""Content-addressed on-disk artifact cache: each entry is a directory built once, atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

from harness.transports.base import sha256_file

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "snapdragon-harness"


@dataclass(frozen=True)
class CacheEntry:
    """A built artifact directory and whether this call found it already built."""

    path: Path
    hit: bool


def content_key(*parts: Any) -> str:
    """Return a short stable hash of parts (paths are hashed by content, the rest as JSON)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(sha256_file(part).encode())
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


class ArtifactCache:
    """Artifacts under root/<kind>/<key>/. A half-built entry never becomes visible."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)

    def entry(self, kind: str, key: str, build: Callable[[Path], None]) -> CacheEntry:
        """Return the entry for (kind, key), calling build(tmp_dir) to fill it when absent.

        build writes into an empty temporary directory that is renamed into place only when it
        returns; if it raises, the temporary directory is removed and the error propagates.
        """
        final = self.root / kind / key
        if final.is_dir():
            return CacheEntry(final, True)
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if final.is_dir():
                return CacheEntry(final, True)
            tmp = final.parent / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                build(tmp)
                os.replace(tmp, final)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        return CacheEntry(final, False)
