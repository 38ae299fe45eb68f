"""Step 3, stage 3: layer-by-layer error isolation, float vs quantized, on the host and on the HTP."""

import pytest


@pytest.mark.step("error_isolation")
def test_error_isolation(error_isolation, check):
    report = check(error_isolation)
    assert report.kpis["layers_compared"] > 0
