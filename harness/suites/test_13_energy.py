"""Step 7, validation: energy per inference above idle, from the device's own power readings."""

import pytest

pytestmark = pytest.mark.validation


@pytest.mark.step("energy")
def test_energy(energy, check):
    report = check(energy)
    assert report.kpis["power_source"] in ("emulated", "measured")
    assert report.kpis["power_usable"] == (report.kpis["energy_per_inference_mj"] is not None)
