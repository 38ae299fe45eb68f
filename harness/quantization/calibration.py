"""Adapters from harness feeds to onnxruntime's quantization API."""

from __future__ import annotations

from onnxruntime.quantization import CalibrationDataReader

from harness.data import Feed


class FeedReader(CalibrationDataReader):
    """A CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[Feed]) -> None:
        self._feeds = feeds
        self._index = 0

    def get_next(self) -> Feed | None:
        if self._index >= len(self._feeds):
            return None
        self._index += 1
        return self._feeds[self._index - 1]
