"""numpy's BLAS on one thread against its default (one per core) for the harness's host comparisons.

Error isolation compares every exposed activation of the float model, the host's QDQ emulation and the HTP (cosine,
SQNR, mean absolute error: dot products over all values). This times that arithmetic (`error_isolation._host_side`
and `_tensor_stats`, the functions the step runs) on random activations as many as ppocrv5_det's (22 M values over
4 samples, feature maps of 4 K to 400 K values per sample), alternating rounds with OpenBLAS's default thread
count and with one thread (`harness.host_sessions.blas_on_one_thread`'s setting), and prints the CPU and wall time
of each and their ratios, measured side by side in one run.

    python benchmarks/bench_host_blas.py [--values-m 22] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from harness.steps import error_isolation as ei  # noqa: E402

SIZES = (4096, 16384, 65536, 102400, 409600)  # values per sample of one tensor (a detector's feature maps)


def activations(values_m: float, samples: int = 4):
    """Return (float, host QDQ, HTP) activations: dicts of tensor -> per-sample arrays, about values_m million
    values per side over all samples."""
    rng = np.random.default_rng(0)
    floats, total = {}, 0
    while total < values_m * 1e6:
        size = int(rng.choice(SIZES))
        floats[f"t{len(floats)}"] = [rng.standard_normal((1, size), dtype=np.float32) for _ in range(samples)]
        total += size * samples
    host = {k: [a + np.float32(0.01) * rng.standard_normal(a.shape, dtype=np.float32) for a in v]
            for k, v in floats.items()}
    htp = {k: [a + np.float32(0.02) * rng.standard_normal(a.shape, dtype=np.float32) for a in v]
           for k, v in floats.items()}
    return floats, host, htp


def compare(floats, host, htp) -> tuple[float, float]:
    """Run error isolation's per-tensor comparisons once; return (CPU s, wall s)."""
    cpu, wall = time.process_time(), time.perf_counter()
    for name in floats:
        side = ei._host_side(floats[name], host[name])
        ei._tensor_stats(floats[name], htp[name], host[name], side)
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values-m", type=float, default=22.0, help="million values per side (default 22)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each setting (default 3)")
    args = parser.parse_args()
    data = activations(args.values_m)
    default_threads = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
    times: dict[str, list[tuple[float, float]]] = {"default": [], "one": []}
    for _ in range(args.rounds):
        times["default"].append(compare(*data))
        with threadpool_limits(1, user_api="blas"):
            times["one"].append(compare(*data))
    median = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for k, v in times.items()}
    print(f"error isolation's comparisons of {len(data[0])} tensors, {args.values_m:g} M values per side, "
          f"median of {args.rounds} alternating rounds:")
    for key, label in (("default", f"BLAS on {default_threads} thread(s) (default)"), ("one", "BLAS on one thread")):
        print(f"  {label:34s} CPU {median[key][0]:6.2f} s   wall {median[key][1]:6.2f} s")
    print(f"  ratio default / one thread: CPU {median['default'][0] / median['one'][0]:.2f}x, "
          f"wall {median['default'][1] / median['one'][1]:.2f}x")


if __name__ == "__main__":
    main()
