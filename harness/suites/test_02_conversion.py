"""Step 2, conversion: fixed shapes and QNN preprocessing produce a loadable float model."""

import pytest


@pytest.mark.step("conversion")
def test_conversion(conversion, check):
    report = check(conversion)
    assert report.artifacts["model"].is_file()
    assert all(all(d > 0 for d in dims) for dims in report.kpis["input_shapes"].values())
