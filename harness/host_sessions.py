"""onnxruntime session options for the harness's host-side sessions (references, QDQ emulation, calibration)."""

from __future__ import annotations

from typing import Any


def host_session_options() -> Any:
    """Return SessionOptions for a host CPU session: warnings off, and idle thread-pool threads sleeping instead
    of spinning (onnxruntime's default), so that host work leaves the cores to the device runners and HTP
    simulators that run beside it; measured on this 2-core machine, no slower alone."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so
