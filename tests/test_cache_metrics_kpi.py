"""The artifact cache's atomicity, the comparison metrics and KPI limits."""

import threading

import numpy as np
import pytest

from harness.cache import ArtifactCache, content_key
from harness.kpi import Limit
from harness.metrics import cosine_similarity, is_classifier_output, sqnr_db


def test_cache_builds_once_and_reports_hits(tmp_path):
    cache = ArtifactCache(tmp_path)
    calls = []

    def build(out):
        calls.append(1)
        (out / "a.txt").write_text("x")

    first = cache.entry("kind", "k1", build)
    second = cache.entry("kind", "k1", build)
    assert (first.hit, second.hit, len(calls)) == (False, True, 1)
    assert (second.path / "a.txt").read_text() == "x"


def test_failed_build_leaves_nothing_behind(tmp_path):
    cache = ArtifactCache(tmp_path)

    def build(out):
        (out / "half.bin").write_bytes(b"partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.entry("kind", "k", build)
    leftovers = [p.name for p in (tmp_path / "kind").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_a_builder_killed_mid_build_leaves_nothing_after_the_next_build(tmp_path):
    """SIGKILL runs no cleanup: the next builder of the same entry deletes the dead one's temporary directory."""
    import signal
    import subprocess
    import sys

    script = ("import sys, time; from harness.cache import ArtifactCache\n"
              "def build(out):\n    (out / 'half.bin').write_bytes(b'partial'); print('building', flush=True); "
              "time.sleep(60)\n"
              "ArtifactCache(sys.argv[1]).entry('kind', 'k', build)\n")
    builder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert builder.stdout.readline().strip() == "building"
    builder.send_signal(signal.SIGKILL)
    builder.wait(timeout=30)
    assert [p.name for p in (tmp_path / "kind").glob(".tmp-k-*")], "the killed builder left no temporary directory"
    entry = ArtifactCache(tmp_path).entry("kind", "k", lambda out: (out / "f").write_text("y"))  # its lock died with it
    assert (entry.path / "f").read_text() == "y" and not entry.hit
    assert sorted(p.name for p in (tmp_path / "kind").iterdir() if not p.name.endswith(".lock")) == ["k"]


def test_concurrent_builders_build_once(tmp_path):
    cache = ArtifactCache(tmp_path)
    calls = []

    def build(out):
        calls.append(1)
        (out / "f").write_text("y")

    threads = [threading.Thread(target=cache.entry, args=("kind", "same", build)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_content_key_hashes_file_content(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("same")
    b.write_text("same")
    assert content_key(a, {"x": 1}) == content_key(b, {"x": 1}) != content_key(a, {"x": 2})


def test_metrics():
    x = np.array([1.0, 2.0, 3.0])
    assert cosine_similarity(x, x) == pytest.approx(1.0)
    assert cosine_similarity(x, -x) == pytest.approx(-1.0)
    assert sqnr_db(x, x) == float("inf")
    noisy = x + np.array([0.1, -0.1, 0.1])
    assert sqnr_db(x, noisy) == pytest.approx(10 * np.log10(np.mean(x ** 2) / 0.01))
    assert is_classifier_output((1, 10)) and not is_classifier_output((1, 3, 8, 8)) and not is_classifier_output((1, 1))


def test_limits_state_their_rule_and_flag_marginal_passes():
    lim = Limit("cosine_similarity", minimum=0.98)
    assert str(lim) == "cosine_similarity >= 0.98"
    assert lim.check(0.99).passed and not lim.check(0.99).marginal
    assert lim.check(0.985).marginal
    assert not lim.check(0.97).passed
    assert "FAIL: cosine_similarity = 0.97, rule cosine_similarity >= 0.98" == str(lim.check(0.97))
    assert not lim.check(None).passed
    both = Limit("x", minimum=0, maximum=1)
    assert str(both) == "x >= 0 and x <= 1" and not both.check(2).passed
