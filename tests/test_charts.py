"""Charts drawn on their own thread: ready() waits for the file, a chart that fails leaves no file (half-written or
temporary) and is logged, and wait_all() leaves nothing pending."""

from __future__ import annotations

import logging

from harness.cache import ArtifactCache
from harness.reporting import charts


def test_a_chart_is_a_whole_png_once_ready(tmp_path):
    path = charts.latency_histogram([1.0, 1.2, 0.9, 1.1] * 10, {"p50": 1.05, "p90": 1.2, "p99": 1.2}, "t",
                                    tmp_path / "hist.png")
    assert path == tmp_path / "hist.png"
    assert charts.ready(path) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hist.png"]


def test_a_chart_that_fails_leaves_no_file_and_says_why(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="harness.reporting.charts"):
        path = charts.per_op_bars([{"node": "n", "op_type": "Conv"}], "t", tmp_path / "bars.png")  # no 'cycles'
        charts.wait_all()
    assert not charts.ready(path)
    assert list(tmp_path.iterdir()) == []
    assert "bars.png could not be drawn" in caplog.text and "KeyError: 'cycles'" in caplog.text


def test_a_cached_chart_is_drawn_once_per_content(tmp_path):
    cache = ArtifactCache(tmp_path / "cache")
    rows = [(0, "a", 30.0, 25.0, 0.999, 0.99), (1, "b", 20.0, 5.0, 0.99, 0.7)]
    first = charts.in_cache(cache, "plots", "k1", "sqnr.png", charts.sqnr_along_graph, rows, (1, "b", 5.0), 0.98)
    assert charts.ready(first) and first.parent == cache.path("plots", "k1")
    written = first.stat().st_mtime_ns
    again = charts.in_cache(cache, "plots", "k1", "sqnr.png", charts.sqnr_along_graph, rows, None, 0.98)
    assert charts.ready(again) and again == first and first.stat().st_mtime_ns == written
