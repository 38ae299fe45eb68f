"""Cold vs warm run of the default suite (`pytest suites/ --device sm8650`), side by side.

Cold: an empty artifact cache (the zoo model is trained, the model converted and quantized,
sweep candidates quantized and evaluated, the context binary compiled, inputs staged on the
emulated device). Warm: the same cache again, so only the device measurements (placement,
float and PTQ runs, load times, the profile's timing loop, runtime integration) and the checks
repeat. Prints both wall times and the ratio for the whole default run and for the spine's four
steps (feasibility, conversion, float baseline, PTQ); the target is warm >= 3x faster.

Both runs keep Python's bytecode cache on, as on a user's machine (this sandbox sets
PYTHONDONTWRITEBYTECODE=1, which makes every run recompile and assertion-rewrite every module of
pytest's plugins; it is dropped for the measured runs).

    python benchmarks/bench_cold_warm.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


SPINE = ["-k", "feasibility or conversion or float_baseline or ptq"]


def run_suite(cache_dir: Path, *extra: str) -> float:
    """Return the wall time of one default suite run with cache_dir; raise if it did not pass."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/", "--device", "sm8650", "-q",
                           "-p", "no:cacheprovider", "--cache-dir", str(cache_dir), *extra],
                          cwd=REPO, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"suite failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="cold/warm pairs to run (default 3)")
    args = parser.parse_args()
    for label, extra in (("default run, all steps", []), ("spine steps only", SPINE)):
        cold, warm = [], []
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
                cold.append(run_suite(Path(tmp), *extra))
                warm.append(run_suite(Path(tmp), *extra))
            print(f"{label}, round {i + 1}: cold {cold[-1]:6.2f} s   warm {warm[-1]:6.2f} s   "
                  f"ratio {cold[-1] / warm[-1]:4.1f}x")
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"{label}: median cold {c:.2f} s, warm {w:.2f} s, warm run is {c / w:.1f}x faster "
              f"(target >= 3x; cold target < 120 s)")


if __name__ == "__main__":
    main()
