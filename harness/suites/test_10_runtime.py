"""Step 6, runtime integration: the context binary run on the device matches the host's run of it."""

import pytest


@pytest.mark.step("runtime")
def test_runtime(runtime, check):
    report = check(runtime)
    assert report.kpis["samples"] > 0
