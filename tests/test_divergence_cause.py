"""Error isolation's divergence cause: the HTP is blamed only when it departs from the host's QDQ
emulation more than the emulation departs from float (numbers from pp-ocrv4 seal det and hey_jarvis)."""

from __future__ import annotations

import pytest

from harness.steps.error_isolation import LayerStats, divergence


def row(index: int, htp: float, host: float, htp_vs_host: float) -> LayerStats:
    return LayerStats(index, f"n{index}", "Conv", f"t{index}", 8, htp, 0.0, 0.0, host, 0.0, 0.0, htp_vs_host,
                      1.0, 0.0, "", "")


@pytest.mark.parametrize("htp, host, htp_vs_host, cause", [
    (0.897, 0.906, 0.988, "quantization"),  # seal det at 128x128: the HTP follows the emulation, both borderline
    (0.000, 1.000, 0.001, "htp"),  # hey_jarvis Sigmoid on near-zero probabilities: only the HTP loses them
    (0.850, 0.800, 0.950, "quantization"),  # both below 0.9
], ids=["borderline", "htp-only", "both"])
def test_the_cause_of_the_first_divergence(htp, host, htp_vs_host, cause):
    first, _, got = divergence([row(0, 0.99, 0.99, 0.999), row(1, htp, host, htp_vs_host)])
    assert (first.index, got) == (1, cause)
