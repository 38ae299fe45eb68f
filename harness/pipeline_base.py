"""What the single-graph pipeline (harness.pipeline) and the LLM pipeline (harness.llm.pipeline) share: the
target, its device's runner, the artifact cache, Step 7's options, per-instance memoisation and where a step
keeps its run's files."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, TypeVar

from harness.cache import ArtifactCache
from harness.host_sessions import blas_on_one_thread
from harness.models import Thresholds
from harness.runner.client import DeviceRunner
from harness.target import Target
from harness.options import ValidationOptions

T = TypeVar("T")


def memoized(method: Callable[[Any], T]) -> Callable[[Any], T]:
    """Cache a method's result, or the exception it raised, per instance (in the instance's `_memo` dict)."""
    @functools.wraps(method)
    def wrapper(self: Any) -> T:
        memo = self._memo
        if method.__name__ not in memo:
            try:
                memo[method.__name__] = (True, method(self))
            except Exception as e:  # re-raised below, and on every later call
                memo[method.__name__] = (False, e)
        ok, value = memo[method.__name__]
        if not ok:
            raise value
        return value
    return wrapper


class PipelineBase:
    """Artifacts and step reports for one Target, computed on demand and memoised (see memoized)."""

    def __init__(self, target: Target, runner: DeviceRunner, cache: ArtifactCache,
                 validation: ValidationOptions | None = None) -> None:
        self.target = target
        self.runner = runner
        self.cache = cache
        self.validation = validation or ValidationOptions()
        self._memo: dict[str, Any] = {}
        blas_on_one_thread()  # the host's arithmetic leaves the cores to the device runners (harness.host_sessions)

    @property
    def thresholds(self) -> Thresholds:
        """The model's KPI thresholds."""
        return self.target.model.thresholds

    def _run_dir(self, step: str) -> Path:
        """Return where `step` keeps this target's run files (charts, raw profiles) under the cache."""
        return self.cache.root / "runs" / self.target.id / step
