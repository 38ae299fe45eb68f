"""The CI session's longest-first order (tests/longest_first.py) and the durations it records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import longest_first


def _item(nodeid: str):
    return SimpleNamespace(nodeid=nodeid)


def test_modules_go_longest_first_each_kept_together_with_its_cases_longest_first():
    items = [_item(n) for n in ("a.py::t1", "a.py::t2", "b.py::slow[x]", "b.py::slow[y]", "b.py::fast", "c.py::new")]
    known = {"a.py::t1": 5, "a.py::t2": 1, "b.py::slow[x]": 10, "b.py::slow[y]": 60, "b.py::fast": 1}
    ordered = [i.nodeid for i in longest_first.longest_first(items, known)]
    # b (71 s) before a (6 s) before c (one unrecorded test: the median, 5 s); b's cases longest first, its
    # functions and a's tests in their collected order
    assert ordered == ["b.py::slow[y]", "b.py::slow[x]", "b.py::fast", "a.py::t1", "a.py::t2", "c.py::new"]
    # a module of one long test (as SmolLM2's LLM suites) goes before one of many shorter ones with a larger total
    items += [_item("d.py::long"), *(_item(f"e.py::t{k}") for k in range(8))]
    known |= {"d.py::long": 100} | {f"e.py::t{k}": 20 for k in range(8)}
    ordered = [i.nodeid for i in longest_first.longest_first(items, known)]
    assert ordered[0] == "d.py::long" and ordered[1:4] == ["b.py::slow[y]", "b.py::slow[x]", "b.py::fast"]
    assert ordered[4:12] == [f"e.py::t{k}" for k in range(8)]


def test_the_recorder_adds_up_phases_and_merges_into_the_file(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"old.py::kept": 3.0, "a.py::t": 99.0}))
    recorder = longest_first.Recorder(path)
    for phase_seconds in (0.5, 2.0, 0.25):
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid="a.py::t", duration=phase_seconds))
    recorder.pytest_sessionfinish()
    assert longest_first.load(path) == {"a.py::t": 2.8, "old.py::kept": 3.0}
    assert not list(tmp_path.glob("*.tmp"))


def test_a_missing_or_broken_file_orders_nothing(tmp_path):
    assert longest_first.load(tmp_path / "missing.json") == {}
    (tmp_path / "broken.json").write_text("{not json")
    assert longest_first.load(tmp_path / "broken.json") == {}
