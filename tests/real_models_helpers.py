"""The real-model corpus for tests: paths of the fetched models and their model specs.

The corpus is fetched once, outside the tests (`python -m harness corpus fetch`); a test that needs
a model that is not there is skipped with that command. Nothing is downloaded here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import corpus

FETCH_HINT = "run `python -m harness corpus fetch` first"


def corpus_dirs() -> list[Path]:
    """Return the directories searched for the corpus: $HARNESS_CORPUS_DIR, then the fetcher's default
    ($HARNESS_CACHE_DIR/real-models), then ~/.cache/snapdragon-harness/real-models."""
    from harness.cache import DEFAULT_CACHE_DIR

    dirs = [Path(os.environ["HARNESS_CORPUS_DIR"])] if os.environ.get("HARNESS_CORPUS_DIR") else []
    dirs += [corpus.default_dir(), Path(DEFAULT_CACHE_DIR).expanduser() / "real-models"]
    return list(dict.fromkeys(d.expanduser() for d in dirs))


def corpus_names() -> list[str]:
    """Return the names of the corpus models, as harness/corpus.yaml lists them."""
    return list(corpus.load_manifest().models)


def _find(name: str, where) -> Path:
    manifest = corpus.load_manifest()
    if name not in manifest.models and name not in manifest.llms:
        raise KeyError(f"{name} is not a corpus model (harness/corpus.yaml lists: {', '.join(corpus_names())})")
    for root in corpus_dirs():
        path = where(root, name)
        if path.is_file():
            return path
    pytest.skip(f"real model {name} not fetched ({FETCH_HINT})")


def real_model_path(name: str) -> Path:
    """Return the ONNX file of corpus model `name`, skipping the test when it has not been fetched."""
    return _find(name, corpus.model_path)


def real_llm_checkpoint(name: str) -> Path:
    """Return the checkpoint (GGUF) of corpus language model `name`, skipping the test when it has not been fetched."""
    return _find(name, corpus.llm_checkpoint_path)


def real_model_spec(name: str) -> Path:
    """Return the model spec YAML of corpus model `name` (shapes, calibration data, frozen inputs),
    skipping the test when it has not been fetched."""
    return _find(name, corpus.spec_path)
