"""Local files: written atomically (a temporary file in the same folder, renamed into place: readers never see half),
copied the same way, and hashed."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside path to write; when the block ends it gets mode and is renamed over path
    (an error or an interruption removes it instead). path's folder must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)  # mkstemp creates 0600; artifacts are shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomically(path: Path, data: bytes) -> Path:
    """Write data to path (mode 0644, fsynced) through a temporary file and a rename; return path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def copy_atomically(src: Path, dst: Path) -> Path:
    """Copy src to dst (mode 0644) through a temporary file and a rename; return dst."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with replacing(dst) as tmp:
        shutil.copyfile(src, tmp)
    return dst


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Hard-link src to dst (one copy on disk: for files never changed in place, such as cache artifacts),
    copying it when linking is not possible (another file system)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_text_atomically(path: Path, text: str) -> Path:
    """Write UTF-8 text to path atomically; return path."""
    return write_atomically(path, text.encode("utf-8"))


def sha256_file(path: Path) -> str:
    """Return the hex SHA-256 of a local file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def external_data_files(model: Path) -> list[Path]:
    """Return the files beside an ONNX model that hold its external data (`<stem>*.data`, as onnx, onnx-ir and
    onnxruntime's quantizer name them), sorted."""
    model = Path(model)
    return sorted(p for p in model.parent.glob(model.stem + "*") if p != model and p.suffix == ".data")


def content_digest(path: Path) -> str:
    """Return sha256_file(path), computed once per version of the file (its inode, size and modification time:
    the harness writes files by rename, so a rewrite is a new version), for keys that name a file by content (the
    artifact cache's, a pushed model's): the precision search keys every candidate by the same float model (90 MB
    for paraphrase_minilm, 0.2-0.3 s each). A check that a file is intact (harness.cache_check) reads it anew with
    sha256_file."""
    st = os.stat(path)
    return _digest_of_version((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), Path(path))


def model_digest(path: Path) -> str:
    """Return content_digest(path), combined with those of an ONNX model's external data files when it has any:
    two checkpoints of one architecture give the same graph file with different weights beside it."""
    data = external_data_files(path) if str(path).endswith(".onnx") else []
    if not data:
        return content_digest(path)
    return hashlib.sha256("\0".join(content_digest(p) for p in [Path(path), *data]).encode()).hexdigest()


_digests: dict[tuple[int, int, int, int], str] = {}


def _digest_of_version(version: tuple[int, int, int, int], path: Path) -> str:
    """Return the digest of the file version (device, inode, size, mtime: kept by a rename, so an entry sealed in
    its temporary folder is known under its final name) at path, reading it the first time."""
    if version not in _digests:
        if len(_digests) >= 4096:
            _digests.clear()
        _digests[version] = sha256_file(path)
    return _digests[version]
