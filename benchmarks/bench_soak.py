"""What does Step 7's soak cost the device? Two ratios, measured side by side in one run.

1. Soak overhead: inferences per second of the device runner's soak (harness.runner.client
   DeviceRunner.soak, per-window statistics, the emulated-NPU accounting, the device-side telemetry
   sampler at the sustained step's 0.5 s) against a raw loop of the same context binary in one
   process (a QNN EP session and `while: session.run`, started on the same emulated device through its
   transport, so both share its environment), in A B B A order per round so drifting load hits both
   alike. Goal: soak / raw >= 97 %.
2. The telemetry sampler's cost on the device: the same soak with the sampler off, at 0.5 s and at
   0.1 s: samples per second it achieved, the CPU time its thread and its dumpsys processes (Android's
   thermal status, read at most every 2 s) used, as a share of the soak's wall time, and the throughput
   against the sampler-off soak.

The model is the zoo's digits_cnn, 8-bit, compiled for sm8650 (on this x86-64 host the HTP simulator).
The emulated device's throttling is disabled here (its trip point is set above any reachable
temperature): throttling is the device's behaviour, not the harness's overhead.

    python benchmarks/bench_soak.py [--rounds 2] [--seconds 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.model_sources import dataset_for, source_model  # noqa: E402
from harness.models import ModelSpec  # noqa: E402
from harness.runner.base import push_model  # noqa: E402
from harness.runner.client import DeviceRunner, SoakSpec  # noqa: E402
from harness.soak import soak_run  # noqa: E402
from harness.steps import conversion, ptq  # noqa: E402
from harness.steps.context_binary import compile_context  # noqa: E402
from harness.transports import open_transport  # noqa: E402


RAW_LOOP = """
import sys, time, numpy as np, onnxruntime as ort, onnxruntime_qnn
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
so = ort.SessionOptions()
so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"],
                            {"backend_type": "htp", "htp_arch": sys.argv[3], "soc_model": sys.argv[4]})
session = ort.InferenceSession(sys.argv[1], so)
inp = session.get_inputs()[0]
feed = {inp.name: np.fromfile(sys.argv[5], dtype=np.float32).reshape(inp.shape)}
names = [o.name for o in session.get_outputs()]
session.run(names, feed)
count, start = 0, time.perf_counter()
while time.perf_counter() - start < float(sys.argv[2]):
    session.run(names, feed)
    count += 1
print(count / (time.perf_counter() - start))
"""


def raw_loop(runner: DeviceRunner, ctx_model: Path, feed: dict, seconds: float, tmp: Path) -> float:
    """Run the context binary in a plain loop in one process on the same (emulated) device; return inferences/s."""
    import numpy as np

    transport = runner.transport
    script, raw = tmp / "raw_loop.py", tmp / "input.raw"
    script.write_text(RAW_LOOP)
    np.ascontiguousarray(next(iter(feed.values())), dtype=np.float32).tofile(raw)
    transport.push(script, "bench/raw_loop.py")
    transport.push(raw, "bench/input.raw")
    remote = push_model(runner.transport, ctx_model)
    soc = transport.soc
    result = transport.run([*transport.python, "bench/raw_loop.py", remote, repr(seconds), str(soc.htp_arch),
                            str(soc.soc_model), "bench/input.raw"], timeout_s=seconds + 120)
    if result.rc != 0:
        raise SystemExit(f"raw loop failed: {result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def soak_rate(runner: DeviceRunner, ctx_model: Path, feed: dict, seconds: float, interval_s: float):
    """Run the device runner's soak; return (inferences per second, the parsed SoakRun)."""
    run = runner.soak(ctx_model, [feed], SoakSpec(duration_s=seconds, window_s=seconds / 4,
                                                  telemetry_interval_s=interval_s))
    soak = soak_run(run, "emulated")
    return len(soak.iteration_s) / soak.duration_s, soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()

    cache = ArtifactCache(Path(DEFAULT_CACHE_DIR).expanduser())
    devices = load_devices_file(REPO / "devices.yaml")
    soc = devices.soc("sm8650")
    spec = ModelSpec(name="digits_cnn", source="zoo")
    fixed = conversion.fixed_shape_model(source_model(spec, cache), spec, cache)
    data = dataset_for(spec, fixed, cache)
    converted = conversion.convert(source_model(spec, cache), fixed, spec, cache).artifacts["model"]
    ctx = compile_context(ptq.quantize(converted, data.calibration, ptq.QuantRecipe(), cache), soc, cache)
    feed = data.evaluation[0]

    no_throttle = soc.model_copy(update={"thermal": soc.thermal.model_copy(
        update={"throttle_trip_c": 500.0, "throttle_clear_c": 490.0, "status_severe_c": 501.0,
                "status_critical_c": 502.0, "status_emergency_c": 503.0, "status_shutdown_c": 504.0})})
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        dev = devices.select(["sm8650-emu"])[0]
        runner = DeviceRunner(open_transport(dev, no_throttle, Path(tmp)))
        raw, soaked = [], []
        for r in range(args.rounds):
            a = raw_loop(runner, ctx.model, feed, args.seconds, Path(tmp))
            b = soak_rate(runner, ctx.model, feed, args.seconds, 0.5)[0]
            c = soak_rate(runner, ctx.model, feed, args.seconds, 0.5)[0]
            d = raw_loop(runner, ctx.model, feed, args.seconds, Path(tmp))
            raw += [a, d]
            soaked += [b, c]
            print(f"round {r + 1}: raw {a:.0f} / {d:.0f} inf/s, soak {b:.0f} / {c:.0f} inf/s")
        ratio = statistics.median(soaked) / statistics.median(raw)
        print(f"soak overhead: soak {statistics.median(soaked):.0f} inf/s vs raw loop {statistics.median(raw):.0f} "
              f"inf/s (one process each, on the same emulated device): ratio {ratio:.3f} (goal >= 0.97)")

        print("\ntelemetry sampler on the device (soak of %.0f s each, same order every round):" % args.seconds)
        rows: dict[str, list] = {"off": [], "0.5 s": [], "0.1 s": []}
        for _ in range(args.rounds):
            for label, interval in (("off", 0.0), ("0.5 s", 0.5), ("0.1 s", 0.1)):
                rows[label].append(soak_rate(runner, ctx.model, feed, args.seconds, interval))
        base = statistics.median(rate for rate, _ in rows["off"])
        for label, results in rows.items():
            rate = statistics.median(r for r, _ in results)
            if label == "off":
                print(f"  sampler off: {rate:.0f} inf/s")
                continue
            soak = results[-1][1]
            samples_per_s = len(soak.samples) / soak.duration_s
            cpu_s = (soak.sampler_cpu_s or 0.0) + (soak.sampler_children_cpu_s or 0.0)
            print(f"  sampler every {label}: {samples_per_s:.1f} samples/s, CPU {cpu_s * 1000:.0f} ms "
                  f"({cpu_s / soak.duration_s:.2%} of the soak: thread {(soak.sampler_cpu_s or 0) * 1000:.0f} ms, "
                  f"dumpsys every 2 s {(soak.sampler_children_cpu_s or 0) * 1000:.0f} ms), "
                  f"throughput {rate:.0f} inf/s = {rate / base:.3f} x sampler off")
        runner.transport.close()


if __name__ == "__main__":
    main()
