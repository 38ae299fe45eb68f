"""Content-addressed on-disk artifact cache: each entry is a directory built once, atomically."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

from harness.cache_check import damage, is_sealed, seal
from harness.files import model_digest

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "snapdragon-harness"


@dataclass(frozen=True)
class CacheEntry:
    """A built artifact directory, whether this call found it already built, and, when this call rebuilt
    it because the cached files were damaged, what was wrong ('model_ctx_qnn.bin: 123 bytes, expected 456')."""

    path: Path
    hit: bool
    healed: str | None = None


def content_key(*parts: Any) -> str:
    """Return a short stable hash of parts (paths are hashed by content, a model's with its external data; the rest
    as JSON)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            h.update(model_digest(part).encode())
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


class ArtifactCache:
    """Artifacts under root/<kind>/<key>/. A half-built entry never becomes visible.

    Each entry is sealed with a manifest of its files' sizes and digests (harness.cache_check); an entry
    whose files no longer match it is discarded and rebuilt on read, and the rebuild is reported
    (CacheEntry.healed). An entry from before manifests existed is trusted and sealed on its first read.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self._invalidated: dict[tuple[str, str], str] = {}  # why a consumer discarded an entry, until rebuilt
        self.heals: list[str] = []  # '<kind>/<key>: what was wrong', for every entry this cache rebuilt

    def path(self, kind: str, key: str) -> Path:
        """Return where the entry for (kind, key) is (or will be once built)."""
        return self.root / kind / key

    def entry(self, kind: str, key: str, build: Callable[[Path], None]) -> CacheEntry:
        """Return the entry for (kind, key), calling build(tmp_dir) to fill it when absent or damaged.

        build writes into an empty temporary directory that is sealed and renamed into place only
        when it returns; if it raises, the temporary directory is removed and the error propagates.
        """
        final = self.path(kind, key)
        if final.is_dir() and is_sealed(final) and damage(final) is None:
            return CacheEntry(final, True)
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            healed = self._invalidated.pop((kind, key), None)
            if final.is_dir():
                if not is_sealed(final):  # built by an older version: trusted once, sealed from now on
                    seal(final)
                    return CacheEntry(final, True)
                if (healed := damage(final)) is None:
                    return CacheEntry(final, True)
                _discard(final)
            _sweep_leftovers(final)
            tmp = final.parent / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                build(tmp)
                seal(tmp)
                os.replace(tmp, final)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        if healed is not None:
            logger.warning("cache entry %s/%s was damaged (%s); rebuilt", kind, key, healed)
            self.heals.append(f"{kind}/{key}: {healed}")
        return CacheEntry(final, False, healed)

    def invalidate(self, kind: str, key: str, reason: str) -> None:
        """Discard the entry for (kind, key) because a consumer failed on it; the next entry() call rebuilds
        it and reports reason as CacheEntry.healed."""
        final = self.path(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if final.is_dir():
                _discard(final)
            self._invalidated[(kind, key)] = reason


def _sweep_leftovers(entry: Path) -> None:
    """Delete what a builder of entry killed mid-build (SIGKILL, power loss) left beside it: its lock is held
    now, so no live builder owns a temporary or discarded directory of this key."""
    for pattern in (f".tmp-{entry.name}-*", f".discarded-{entry.name}-*"):
        for stale in entry.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def _discard(entry: Path) -> None:
    """Move a damaged entry aside (so no reader sees it half-deleted), then delete it; hold its lock."""
    aside = entry.parent / f".discarded-{entry.name}-{uuid.uuid4().hex[:8]}"
    os.replace(entry, aside)
    shutil.rmtree(aside, ignore_errors=True)
