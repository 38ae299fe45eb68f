"""The manifest that seals a cache entry: each file's size and SHA-256 when it was built, checked on read.

The check on every read is cheap: every listed file must exist with its recorded size; files up to
FULL_CHECK_BYTES are hashed in full; a larger file is hashed only when its mtime is newer than the
manifest's (it was written after the entry was sealed), and once it matches the manifest's mtime is
moved forward, so it is not hashed again. Damage that changes neither size nor mtime in a large file
(bit-rot on the disk itself) is left to the consumer that fails on it (ArtifactCache.invalidate).
Files added to an entry after it was sealed (e.g. a context binary's graph_cost.json) are not checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.files import content_digest, replacing, sha256_file

MANIFEST = ".cache-manifest.json"
FULL_CHECK_BYTES = 1 << 20  # files up to this size are hashed on every read


def seal(directory: Path) -> None:
    """Write the manifest of every file under directory (atomically, replacing an older one)."""
    directory = Path(directory)
    files = {p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": content_digest(p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}
    with replacing(directory / MANIFEST) as tmp:
        tmp.write_text(json.dumps({"version": 1, "files": files}, indent=1) + "\n")


def is_sealed(directory: Path) -> bool:
    """Return whether directory has a manifest (entries built before manifests existed have none)."""
    return (Path(directory) / MANIFEST).is_file()


def damage(directory: Path) -> str | None:
    """Return what is wrong with a sealed directory's files ('model_ctx_qnn.bin: 123 bytes, expected 456'),
    or None when they match its manifest (see the module docstring for what is hashed)."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    try:
        sealed_ns = manifest.stat().st_mtime_ns
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST}: unreadable ({type(e).__name__})"
    rehashed = False
    for rel, want in files.items():
        path = directory / rel
        try:
            stat = path.stat()
        except OSError:
            return f"{rel}: missing"
        if stat.st_size != want["size"]:
            return f"{rel}: {stat.st_size} bytes, expected {want['size']}"
        if stat.st_size <= FULL_CHECK_BYTES or stat.st_mtime_ns > sealed_ns:
            rehashed |= stat.st_size > FULL_CHECK_BYTES
            if (digest := sha256_file(path)) != want["sha256"]:
                return f"{rel}: content differs from when it was built (sha256 {digest[:12]}, expected {want['sha256'][:12]})"
    if rehashed:  # large files rewritten with the same content: not hashed again on the next read
        os.utime(manifest)
    return None
