"""Farm scaling: the same suites over the same models on 1, 2 and 4 emulated devices, with pytest-xdist's
`-n` equal to the device count (each device's tests on one worker, `--dist loadgroup`), timed side by side
in one run. Prints each wall time and the speed-up against one device (goal: >= 0.8 x the device count on a
machine with a core or more per device).

Each emulated device runs the device runner (and so Qualcomm's HTP simulator) as host processes, so the
devices share this machine's cores: on a 2-core machine two devices can at most double the throughput,
and four cannot do better than two. Measured here (2 cores): 2 devices ran at 0.65-0.67 x one device and
4 at 0.46 x: concurrent HTP-simulator processes slow each other far more than the core count explains
(feasibility's placement took 17 s beside another simulator against 2.3 s alone; turning off onnxruntime's
thread-pool spinning in the runner did not change it), so on this machine the farm serialises better than
it parallelises; on a real farm each device's runner runs on the device itself. The suites run are Steps 1-6 without the sweep (--sweep off) on the
zoo's digits_cnn; the cache is warmed first so every configuration measures the device work, not model
building.

    python benchmarks/bench_farm.py [--devices 1,2,4] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITES = [f"harness/suites/test_{name}.py" for name in ("01_feasibility", "02_conversion", "03_float_baseline",
                                                         "04_ptq", "08_context_binary", "09_profile", "10_runtime")]


def devices_file(path: Path, count: int) -> Path:
    """Write a devices file with `count` emulated sm8650 devices; return its path."""
    lines = ["devices:"] + [f"  - {{id: farm-{i}, soc: sm8650, transport: emulator}}" for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(count: int, cache: Path, tmp: Path) -> float:
    """Run the suites on `count` devices with -n count; return the wall time in seconds."""
    devices = devices_file(tmp / f"devices-{count}.yaml", count)
    argv = [sys.executable, "-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider", "--devices-file", str(devices),
            *[a for i in range(count) for a in ("--device", f"farm-{i}")], "--cache-dir", str(cache),
            "--sweep", "off", "--device-lock-dir", str(tmp / "locks")]
    if count > 1:
        argv += ["-n", str(count), "--dist", "loadgroup"]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{count} device(s) failed:\n{proc.stdout[-3000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="1,2,4")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    counts = [int(c) for c in args.devices.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-farm-") as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "cache"
        run(1, cache, Path(tmp))  # warm the cache: model, conversion, QDQ model, context binary
        walls = {c: run(c, cache, Path(tmp)) for c in counts}
    base = walls[counts[0]] * counts[0] if counts[0] != 1 else walls[1]
    print(f"machine: {os.cpu_count()} cores; Steps 1-6 (no sweep) on digits_cnn, one model per device")
    for c, wall in walls.items():
        speedup = c * base / wall  # work done (c devices' suites) per unit time, against one device
        print(f"  {c} device(s), -n {c}: {wall:.1f} s wall, speed-up {speedup:.2f} x one device "
              f"({speedup / c:.2f} of the ideal {c}x; goal >= 0.8)")


if __name__ == "__main__":
    main()
