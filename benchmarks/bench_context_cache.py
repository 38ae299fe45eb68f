"""Repeated runs reuse the cached context binary: no recompilation, measured.

1. In process: compile digits_cnn's deployable (quantized) model into a context binary for sm8650 in an empty
   context cache (a miss: the QNN EP compiles), then ask again (a hit), several times.
2. The suite: `pytest suites/test_08_context_binary.py` twice on a cache seeded with the model
   artifacts but no context binary; the first run compiles, the second must report
   `cache_hit: true` with the binary file untouched.

    python benchmarks/bench_context_cache.py [--cache-dir DIR] [--lookups 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.steps.context_binary import compile_context  # noqa: E402

SEED_KINDS = ("zoo", "fixed", "converted", "qdq", "host_reference")  # model artifacts, not context binaries


def deployable_model(cache_dir: Path, devices, sandbox: Path) -> Path:
    """Return digits_cnn's deployable (quantized) model from the pipeline, building what is missing."""
    from harness.models import resolve_model
    from harness.pipeline import Onboarding, Target
    from harness.runner.client import DeviceRunner
    from harness.transports import open_transport

    device = devices.select(["sm8650-emu"])[0]
    soc = devices.soc(device.soc)
    with open_transport(device, soc, sandbox) as transport:
        target = Target(device, soc, resolve_model("digits_cnn", {}, None))
        return Onboarding(target, DeviceRunner(transport), ArtifactCache(cache_dir)).deployable_model()


def suite_run(cache_dir: Path, kpi: Path) -> tuple[float, dict]:
    """Run the context_binary suite once; return (wall seconds, its KPIs)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_08_context_binary.py", "--device", "sm8650",
                           "-q", "-p", "no:cacheprovider", "--cache-dir", str(cache_dir), "--kpi-json", str(kpi)],
                          cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"suite failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    record = next(r for r in json.loads(kpi.read_text())["records"] if r["step"] == "context_binary")
    return wall, record["kpis"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("HARNESS_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser(),
                        help="a cache holding (or to hold) the digits_cnn model artifacts")
    parser.add_argument("--lookups", type=int, default=5)
    args = parser.parse_args()
    devices = load_devices_file(REPO / "devices.yaml")
    soc = devices.soc("sm8650")
    with tempfile.TemporaryDirectory(prefix="bench-ctx-") as tmp:
        model = deployable_model(args.cache_dir, devices, Path(tmp) / "emulator")
        cache = ArtifactCache(Path(tmp) / "ctx")
        start = time.perf_counter()
        cold = compile_context(model, soc, cache)
        cold_s = time.perf_counter() - start
        warm_s = []
        for _ in range(args.lookups):
            start = time.perf_counter()
            warm = compile_context(model, soc, cache)
            warm_s.append(time.perf_counter() - start)
            assert warm.hit and warm.directory == cold.directory
        w = statistics.median(warm_s)
        print(f"in process: cold (compile) {cold_s * 1000:8.1f} ms (QNN compile {cold.compile_s * 1000:.1f} ms, "
              f"hit={cold.hit}); cached lookup {w * 1000:.2f} ms median of {args.lookups} (hit=True); "
              f"{cold_s / w:.0f}x faster")

        seeded = Path(tmp) / "suite-cache"
        for kind in SEED_KINDS:
            if (args.cache_dir / kind).is_dir():
                shutil.copytree(args.cache_dir / kind, seeded / kind)
        first_wall, first = suite_run(seeded, Path(tmp) / "kpi1.json")
        binary = next((seeded / "context_binary").glob("*/model_ctx_qnn.bin"))
        stamp = binary.stat().st_mtime_ns
        second_wall, second = suite_run(seeded, Path(tmp) / "kpi2.json")
        untouched = binary.stat().st_mtime_ns == stamp and len(list((seeded / "context_binary").glob("*/"))) == 1
        print(f"suite run 1: {first_wall:6.2f} s, cache_hit={first['cache_hit']}, compile_s={first['compile_s']:.3f}")
        print(f"suite run 2: {second_wall:6.2f} s, cache_hit={second['cache_hit']}, binary untouched={untouched} "
              f"(no recompilation: {second['cache_hit'] and untouched})")


if __name__ == "__main__":
    main()
