"""How the harness's host-side work shares the cores with the device runners and HTP simulators beside it:
onnxruntime session options for its host sessions (references, QDQ emulation, calibration), and numpy's BLAS on
one thread."""

from __future__ import annotations

import functools
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


@functools.cache
def blas_on_one_thread() -> None:
    """Limit numpy's BLAS (OpenBLAS) to one thread in this process, once; return None. Its second thread busy-waits
    between calls: the comparisons of a detector's 22 M activation values (cosine, SQNR: dot products) took 4-5x the
    CPU time with two threads as with one (error isolation on ppocrv5_det, 2 cores), CPU the simulator on the other
    core needed. The harness's host arithmetic is memory-bound dot products and small matrices, which one thread
    serves as fast."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")
