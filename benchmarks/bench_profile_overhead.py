"""Does the harness's measurement distort what it measures? Raw onnxruntime loop vs the profile step.

The same small model (the zoo's digits_cnn, float) on the `cpu` runtime, timed two ways in one
run, in A B B A order per round so that drifting machine load hits both alike:
  raw:     an onnxruntime CPU session in this process, a perf_counter loop around session.run;
  harness: the profile step's measurement (harness.steps.profile.measure_latency): the device
           runner on the emulated device, the same rule (warm-up, at least N iterations and D s).
Prints the median latency of each per round and overall, and the ratio harness / raw
(target: within 3%).

    python benchmarks/bench_profile_overhead.py [--rounds 4] [--min-iterations 2000] [--min-duration 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.model_sources import source_model  # noqa: E402
from harness.models import ModelSpec  # noqa: E402
from harness.runner.client import DeviceRunner  # noqa: E402
from harness.steps.profile import MeasureRule, latency_stats, measure_latency  # noqa: E402
from harness.transports import open_transport  # noqa: E402


def raw_loop(model: Path, feed: dict, rule: MeasureRule, threads: int) -> list[float]:
    """Time model with a plain onnxruntime CPU session under rule; return seconds per iteration."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for _ in range(rule.warmup):
        session.run(names, feed)
    times: list[float] = []
    clock = time.perf_counter
    start = clock()
    while len(times) < rule.min_iterations or clock() - start < rule.min_duration_s:
        t = clock()
        session.run(names, feed)
        times.append(clock() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--min-iterations", type=int, default=2000)
    parser.add_argument("--min-duration", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads on both sides (default 1: on a shared 2-core machine onnxruntime's "
                             "default pool makes each session's latency differ by +-20%%; 0 = its default)")
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("HARNESS_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser())
    args = parser.parse_args()
    rule = MeasureRule(args.min_iterations, args.min_duration, args.warmup)
    cache = ArtifactCache(args.cache_dir)
    model = source_model(ModelSpec(name="digits_cnn", source="zoo"), cache)
    import numpy as np

    feed = {"image": np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32)}
    devices = load_devices_file(REPO / "devices.yaml")
    device = devices.select(["sm8650-emu"])[0]
    with tempfile.TemporaryDirectory(prefix="bench-emu-") as sandbox:
        transport = open_transport(device, devices.soc(device.soc), Path(sandbox))
        runner = DeviceRunner(transport)
        print(f"model: {model} (digits_cnn, float) on the cpu runtime, {args.threads or 'default'} intra-op "
              f"thread(s); rule: {rule}")
        raw_p50, harness_p50, ratios = [], [], []
        for i in range(args.rounds):  # A B B A: a drift in machine load hits both alike
            raw_a = latency_stats(raw_loop(model, feed, rule, args.threads))
            harness = [measure_latency(runner, model, [feed], "cpu", rule, args.threads).stats for _ in range(2)]
            raw_b = latency_stats(raw_loop(model, feed, rule, args.threads))
            r = statistics.median([raw_a.p50, raw_b.p50])
            h = statistics.median([s.p50 for s in harness])
            raw_p50 += [raw_a.p50, raw_b.p50]
            harness_p50 += [s.p50 for s in harness]
            ratios.append(h / r)
            print(f"round {i + 1}: raw p50 {raw_a.p50 * 1000:7.2f} / {raw_b.p50 * 1000:7.2f} us   harness p50 "
                  f"{harness[0].p50 * 1000:7.2f} / {harness[1].p50 * 1000:7.2f} us   ratio {h / r:.3f}")
        transport.close()
    r, h = statistics.median(raw_p50), statistics.median(harness_p50)
    ratio = h / r
    verdict = "within" if abs(ratio - 1) <= 0.03 else "OUTSIDE"
    print(f"median latency: raw {r * 1000:.2f} us, harness profile step {h * 1000:.2f} us; "
          f"ratio harness/raw {ratio:.3f} ({verdict} the 3% target); "
          f"per-round ratios: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
