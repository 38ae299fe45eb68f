"""Longest-first ordering of the harness's own tests from their recorded durations (the way pytest-split and
Knapsack balance CI by a durations file): under `-n 2 --dist worksteal` each worker starts with half of the
ordered tests and an idle worker takes the other's last ones, so a session whose tests are ordered longest first
ends with both workers busy instead of one finishing a ten-minute corpus model while the other idles.

`tests/durations.json` maps test node ids to seconds (setup + call + teardown); `HARNESS_STORE_TEST_DURATIONS=FILE`
makes a run record its own into FILE (merged with what FILE holds), to refresh the committed file from a CI run.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).resolve().parent / "durations.json"
STORE_ENV = "HARNESS_STORE_TEST_DURATIONS"


def load(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """Return {node id: seconds} recorded in path ({} when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def longest_first(items: list[pytest.Item], known: dict[str, float]) -> list[pytest.Item]:
    """Return items with their modules ordered by their longest known test, then by total known duration, longest
    first (a module holding one long test starts at once, not after a module of many shorter ones that work
    stealing spreads over both workers anyway), each module's tests kept together and in their order (its
    module-scoped fixtures are set up once), each parametrized function's cases longest first. A test never
    recorded counts as the median recorded test."""
    default = statistics.median(known.values()) if known else 1.0
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def seconds(item: pytest.Item) -> float:
        return known.get(item.nodeid, default)

    ordered = []
    for module_items in sorted(modules.values(), key=lambda m: (-max(map(seconds, m)), -sum(map(seconds, m)))):
        cases: dict[str, list[pytest.Item]] = {}  # a test function's parametrized cases, in collection order
        for item in module_items:
            cases.setdefault(item.nodeid.split("[")[0], []).append(item)
        for function_items in cases.values():
            ordered.extend(sorted(function_items, key=lambda item: -seconds(item)))
    return ordered


class Recorder:
    """Adds up each test's setup, call and teardown seconds and merges them into a durations file at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        merged = {**load(self.path), **{k: round(v, 1) for k, v in self.seconds.items()}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
        tmp.replace(self.path)


def register_recorder(config: pytest.Config) -> None:
    """Record this run's durations into $HARNESS_STORE_TEST_DURATIONS (on the controller only under xdist)."""
    target = os.environ.get(STORE_ENV)
    if target and os.environ.get("PYTEST_XDIST_WORKER") is None:
        config.pluginmanager.register(Recorder(Path(target)), "harness-test-durations")
