"""Fixtures shared by the harness's own tests: a session cache, an emulated device, small models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import longest_first
from harness.cache import ArtifactCache
from harness.devices import load_devices_file
from harness.runner.client import DeviceRunner
from harness.transports import open_transport


REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n 2`), give each worker its own emulated devices (own sandboxes and device locks)
    beside the shared artifact cache, so that two workers' suite runs on `--device sm8650` overlap instead of
    queueing on one emulated device's lock; the suite runs they start inherit it through the environment."""
    longest_first.register_recorder(config)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    import tempfile

    base = Path(tempfile.gettempdir()) / f"harness-tests-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')[:12]}"
    os.environ["HARNESS_EMULATOR_DIR"] = str(base / worker / "emulator")
    os.environ["HARNESS_LOCK_DIR"] = str(base / worker / "locks")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest tests first (tests/longest_first.py): CI runs the plain and the corpus tests in one
    `-n 2 --dist worksteal` session, which then ends with both workers busy."""
    items[:] = longest_first.longest_first(items, longest_first.load())


@pytest.fixture(scope="session")
def session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return one artifact cache for the whole test session, so the zoo models are trained once: a fresh
    directory, or $HARNESS_TEST_CACHE_DIR when set (CI sets it to its run's cache, empty when the run starts,
    so that its main job and test stages build each artifact once). Tests of the cache itself use their own."""
    if os.environ.get("HARNESS_TEST_CACHE_DIR"):
        path = Path(os.environ["HARNESS_TEST_CACHE_DIR"]).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("harness-cache")


@pytest.fixture(scope="session")
def cache(session_cache_dir: Path) -> ArtifactCache:
    return ArtifactCache(session_cache_dir)


@pytest.fixture
def own_cache(tmp_path: Path) -> ArtifactCache:
    """Return an artifact cache of this test's own, for a test that asserts on the cache's contents (the session's
    may hold another xdist worker's build in progress: its .tmp-* directory is no leftover of this test)."""
    return ArtifactCache(tmp_path / "own-cache")


@pytest.fixture(scope="session")
def devices():
    return load_devices_file(REPO / "devices.yaml")


@pytest.fixture(scope="session")
def sm8650_runner(devices, tmp_path_factory: pytest.TempPathFactory) -> DeviceRunner:
    """A DeviceRunner on the emulated sm8650 device (the real HTP simulator)."""
    dev = devices.select(["sm8650-emu"])[0]
    transport = open_transport(dev, devices.soc(dev.soc), tmp_path_factory.mktemp("emulator"))
    yield DeviceRunner(transport)
    transport.close()


@pytest.fixture(scope="session")
def qdq(tmp_path_factory: pytest.TempPathFactory, cache: ArtifactCache) -> Path:
    """A tiny QDQ model (see perf_helpers.tiny_qdq_model), shared by the compile and profile tests."""
    from perf_helpers import tiny_qdq_model

    return tiny_qdq_model(tmp_path_factory.mktemp("tiny"), cache)


@pytest.fixture(scope="session")
def ctx(qdq: Path, cache: ArtifactCache, devices):
    """The tiny QDQ model compiled into a context binary for sm8650."""
    from harness.steps.context_binary import compile_context

    return compile_context(qdq, devices.soc("sm8650"), cache)


@pytest.fixture(scope="session")
def tiny_gpt_bundle(cache: ArtifactCache) -> Path:
    """Return the built-in language model's directory in the session cache, trained once per session (once
    per CI run with $HARNESS_TEST_CACHE_DIR): build_bundle's files and the exported prefill/decode graphs."""
    from harness.model_sources import llm_files
    from harness.models import resolve_model

    return llm_files(resolve_model("tiny_gpt", {}, None), cache).tokenizer.parent


@pytest.fixture(scope="session")
def smollm2_import(cache: ArtifactCache):
    """Return the corpus SmolLM2-135M-Instruct imported from its spec (LlmFiles: the Genie-convention pair, the
    tokenizer, the chat prompts), built once per session in the session cache: the entry the LLM suites on it use
    too, so its 1.2 GB of float32 graphs are on disk once. Skips when the corpus is not fetched."""
    from real_models_helpers import real_model_spec

    from harness.llm.importer import import_files
    from harness.model_sources import llm_files
    from harness.models import resolve_model

    spec = resolve_model(str(real_model_spec("smollm2_135m")), {}, None)
    return import_files(llm_files(spec, cache), cache)
