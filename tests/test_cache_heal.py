"""A cache that heals: a damaged cache entry, host or device side, is detected, rebuilt and reported.

The context binary of a real corpus model (mtcnn_pnet) is compiled on the HTP simulator, damaged on
disk as a full disk, an interrupted copy or bit-rot would, and the context binary step is run again.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from harness.cache import ArtifactCache
from harness.cache_check import FULL_CHECK_BYTES, MANIFEST
from harness.errors import StepError
from harness.models import resolve_model
from harness.pipeline import Onboarding, Target
from harness.runner.base import remote_model_path
from harness.steps.context_binary import compile_context, context_binary
from real_models_helpers import real_model_spec


def _flip_byte(path: Path, at: int | None = None) -> None:
    """Invert one byte of path in place (same size), as bit-rot or a stray write would."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)


def _truncate(path: Path) -> int:
    """Cut path to half its size, as a full disk or an interrupted copy would; return its full size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return size


# --------------------------------------------------------------------------- the cache alone


def _two_files(out: Path) -> None:
    (out / "small.json").write_text('{"a": 1}\n')
    (out / "large.bin").write_bytes(os.urandom(FULL_CHECK_BYTES + 4096))


def test_damaged_files_are_detected_and_rebuilt_naming_what_was_wrong(tmp_path):
    cache = ArtifactCache(tmp_path)
    built = cache.entry("kind", "k", _two_files)
    assert (built.hit, built.healed) == (False, None) and (built.path / MANIFEST).is_file()
    assert cache.entry("kind", "k", _two_files).hit

    size = _truncate(built.path / "large.bin")
    again = cache.entry("kind", "k", _two_files)
    assert not again.hit and again.healed == f"large.bin: {size // 2} bytes, expected {size}"
    assert (again.path / "large.bin").stat().st_size == size

    _flip_byte(again.path / "small.json", at=1)  # same size, a small file: hashed on every read
    healed = cache.entry("kind", "k", _two_files)
    assert not healed.hit and healed.healed.startswith("small.json: content differs from when it was built")

    _flip_byte(healed.path / "large.bin")  # same size, rewritten after the entry was sealed: mtime says so
    os.utime(healed.path / "large.bin", ns=(0, (healed.path / MANIFEST).stat().st_mtime_ns + 10**9))
    assert cache.entry("kind", "k", _two_files).healed.startswith("large.bin: content differs")

    (cache.root / "kind" / "k" / "small.json").unlink()
    assert cache.entry("kind", "k", _two_files).healed == "small.json: missing"
    assert len(cache.heals) == 4 and cache.heals[:2] == [f"kind/k: {again.healed}", f"kind/k: {healed.healed}"]
    assert not [p.name for p in (tmp_path / "kind").iterdir() if p.name not in {"k", "k.lock"}], "leftovers"


def test_an_entry_from_an_older_version_is_trusted_once_and_sealed(tmp_path):
    cache = ArtifactCache(tmp_path)
    path = cache.entry("kind", "old", _two_files).path
    (path / MANIFEST).unlink()  # as built before entries had a manifest
    (path / "small.json").write_text('{"a": 2}\n')  # whatever it holds then is what is trusted
    first = cache.entry("kind", "old", _two_files)
    assert (first.hit, first.healed) == (True, None) and (path / MANIFEST).is_file()
    assert (path / "small.json").read_text() == '{"a": 2}\n'
    _flip_byte(path / "small.json", at=1)  # sealed now: damage from here on is caught
    assert cache.entry("kind", "old", _two_files).healed.startswith("small.json: content differs")


def test_a_consumer_invalidates_an_entry_and_the_rebuild_says_why(tmp_path):
    cache = ArtifactCache(tmp_path)
    cache.entry("kind", "k", _two_files)
    cache.invalidate("kind", "k", "the loader could not read it")
    assert not (tmp_path / "kind" / "k").exists()
    rebuilt = cache.entry("kind", "k", _two_files)
    assert (rebuilt.hit, rebuilt.healed) == (False, "the loader could not read it")
    assert cache.entry("kind", "k", _two_files).healed is None


# --------------------------------------------------------------------------- a real model's context binary


@pytest.fixture(scope="module")
def pnet_cache(tmp_path_factory) -> Path:
    """A cache of its own (these tests damage it)."""
    return tmp_path_factory.mktemp("heal-cache")


@pytest.fixture(scope="module")
def pnet_qdq(pnet_cache, sm8650_runner, devices) -> Path:
    """mtcnn_pnet from the corpus, converted and quantized as the pipeline does."""
    dev = devices.select(["sm8650-emu"])[0]
    spec = resolve_model(str(real_model_spec("mtcnn_pnet")), {}, None)
    return Onboarding(Target(dev, devices.soc("sm8650"), spec), sm8650_runner, ArtifactCache(pnet_cache)).qdq_model()


def _compile(qdq: Path, cache_dir: Path, devices):
    """Compile as a later run would: a fresh ArtifactCache on the same directory."""
    return compile_context(qdq, devices.soc("sm8650"), ArtifactCache(cache_dir))


def _blob(ctx) -> Path:
    (blob,) = [p for p in ctx.files if p.suffix == ".bin"]
    return blob


def test_a_truncated_cached_context_binary_is_rebuilt_and_the_step_passes(pnet_qdq, pnet_cache, devices,
                                                                           sm8650_runner):
    ctx = _compile(pnet_qdq, pnet_cache, devices)
    assert context_binary(ctx, pnet_qdq, sm8650_runner).passed
    size = _truncate(_blob(ctx))
    again = _compile(pnet_qdq, pnet_cache, devices)
    assert not again.hit and again.directory == ctx.directory
    assert again.healed == f"{_blob(ctx).name}: {size // 2} bytes, expected {size}"
    report = context_binary(again, pnet_qdq, sm8650_runner)
    assert report.passed, report.problems()
    assert report.kpis["cache_hit"] is False and _blob(again).stat().st_size == size
    assert any(f"{_blob(ctx).name}: {size // 2} bytes, expected {size}" in n and "compiled again" in n
               for n in report.notes), report.notes


def test_an_altered_byte_of_the_cached_wrapper_is_detected(pnet_qdq, pnet_cache, devices):
    ctx = _compile(pnet_qdq, pnet_cache, devices)
    assert ctx.model.stat().st_size <= FULL_CHECK_BYTES
    _flip_byte(ctx.model)
    again = _compile(pnet_qdq, pnet_cache, devices)
    assert not again.hit and again.healed.startswith(f"{ctx.model.name}: content differs from when it was built")


def test_a_binary_damaged_after_the_check_is_rebuilt_when_the_device_cannot_load_it(pnet_qdq, pnet_cache, devices,
                                                                                    sm8650_runner):
    ctx = _compile(pnet_qdq, pnet_cache, devices)
    _truncate(_blob(ctx))  # after the cache checked it: only the device runner's load finds out
    report = context_binary(ctx, pnet_qdq, sm8650_runner)
    assert report.passed, report.problems()
    assert any("the device runner could not load it" in n and "compiled again" in n for n in report.notes), \
        report.notes
    assert _compile(pnet_qdq, pnet_cache, devices).hit


def test_a_truncated_binary_from_an_older_version_is_rebuilt_when_the_device_cannot_load_it(
        pnet_qdq, pnet_cache, devices, sm8650_runner):
    ctx = _compile(pnet_qdq, pnet_cache, devices)
    (ctx.directory / MANIFEST).unlink()  # the case: an entry written before manifests, then truncated
    _truncate(_blob(ctx))
    trusted = _compile(pnet_qdq, pnet_cache, devices)
    assert (trusted.hit, trusted.healed) == (True, None)  # trusted once and sealed, as documented
    report = context_binary(trusted, pnet_qdq, sm8650_runner)
    assert report.passed, report.problems()
    assert any("INVALID_GRAPH" in n and "compiled again" in n for n in report.notes), report.notes


def test_a_binary_that_fails_again_after_its_rebuild_is_named(pnet_qdq, pnet_cache, devices, sm8650_runner):
    ctx = _compile(pnet_qdq, pnet_cache, devices)

    def rebuild_onto_a_failing_disk(reason: str):
        rebuilt = ctx.rebuild(reason)
        _truncate(_blob(rebuilt))
        return rebuilt

    _truncate(_blob(ctx))
    with pytest.raises(StepError) as info:
        context_binary(dataclasses.replace(ctx, rebuild=rebuild_onto_a_failing_disk), pnet_qdq, sm8650_runner)
    message = str(info.value)
    assert f"could not load the context binary {ctx.model}" in message and _blob(ctx).name in message
    assert "neither as cached nor compiled again from model.onnx" in message and "INVALID_GRAPH" in message
    assert _compile(pnet_qdq, pnet_cache, devices).healed  # the damage is caught on the next read


# --------------------------------------------------------------------------- files pushed to a device


def test_a_model_altered_on_the_emulated_device_is_pushed_again(pnet_qdq, pnet_cache, devices, sm8650_runner):
    ctx = _compile(pnet_qdq, pnet_cache, devices)
    sm8650_runner.run(ctx.model, None, "htp", placement_only=True)
    remote_dir = sm8650_runner.transport.workdir / Path(remote_model_path(ctx.model)).parent
    pushed = remote_dir / _blob(ctx).name
    assert pushed.read_bytes() == _blob(ctx).read_bytes()
    _flip_byte(pushed)
    report = context_binary(ctx, pnet_qdq, sm8650_runner)
    assert report.passed, report.problems()
    assert pushed.read_bytes() == _blob(ctx).read_bytes()
    assert not any("compiled again" in n for n in report.notes), "the host's cache was sound"


def test_a_shell_transport_finds_files_altered_after_it_pushed_them(tmp_path, devices):
    from servers import SSHD, ssh_server

    from harness.devices import SshDevice
    from harness.transports import open_transport

    if not Path(SSHD).exists():
        pytest.skip("openssh-server is not installed")
    src = tmp_path / "model"
    src.mkdir()
    (src / "model_ctx.onnx").write_bytes(b"wrapper")
    (src / "model_ctx_qnn.bin").write_bytes(os.urandom(4096))
    with ssh_server(tmp_path / "sshd") as sshd:
        entry = SshDevice(**sshd.device_entry(soc="sm8650", workdir=str(tmp_path / "workdir"), soc_detect="off"))
        with open_transport(entry, devices.soc("sm8650"), tmp_path) as ssh:
            assert ssh.push(src, "models/abc").files_sent == 2
            on_device = Path(ssh.workdir) / "models" / "abc" / "model_ctx_qnn.bin"
            _flip_byte(on_device)  # behind the transport's back
            assert ssh.push(src, "models/abc").files_sent == 0  # the remembered hash skips the check
            assert ssh.verify_pushed(["models/abc"]) == ["models/abc/model_ctx_qnn.bin"]
            again = ssh.push(src, "models/abc")
            assert (again.files_sent, again.files_skipped) == (1, 1)
            assert on_device.read_bytes() == (src / "model_ctx_qnn.bin").read_bytes()
            assert ssh.verify_pushed(["models/abc"]) == []
