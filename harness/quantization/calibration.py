"""Adapters from harness feeds to onnxruntime's quantization API."""

from __future__ import annotations

from onnxruntime.quantization import CalibrationDataReader

from harness.data import Feed


class FeedReader(CalibrationDataReader):
    """A CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[Feed]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._feeds, None)
