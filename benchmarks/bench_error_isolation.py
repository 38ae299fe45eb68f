"""Error isolation costs one inference pass per model and runtime, whatever the number of layers.

For residual CNNs of more than 100 nodes, prints the wall time of error isolation's capture pass
divided by the wall time of one plain inference pass of the same model on the same runtime (same
samples): on the device's `htp` runtime (the emulator's HTP simulator) and on the host (float model
plus QDQ emulation). A ratio near 1 that does not grow with the node count is the target.

    python benchmarks/bench_error_isolation.py [--blocks 20 60] [--samples 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from harness.cache import ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.models import resolve_model  # noqa: E402
from harness.pipeline import Onboarding, Target  # noqa: E402
from harness.runner.client import DeviceRunner  # noqa: E402
from harness.steps import error_isolation as ei  # noqa: E402
from harness.steps.inference import run_host  # noqa: E402
from harness.transports import open_transport  # noqa: E402
from models_outlier import build_deep_model  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def bench(blocks: int, samples: int, rounds: int, work: Path, cache: ArtifactCache, runner: DeviceRunner,
          devices) -> None:
    import onnx

    path = build_deep_model(work / f"deep_{blocks}.onnx", blocks=blocks)
    dev = devices.select(["sm8650-emu"])[0]
    ob = Onboarding(Target(dev, devices.soc(dev.soc), resolve_model(str(path), {}, None)), runner, cache)
    float_model, qdq = ob.converted_model(), ob.qdq_model()
    feeds = ob.dataset().evaluation[:samples]
    exposed, tensors = ei.expose_quantized_tensors(qdq, cache)
    nodes = len(onnx.load(str(float_model)).graph.node)
    runner.run(qdq, feeds, "htp")  # stage model and inputs on the device once
    runner.run(exposed, feeds, "htp")
    htp_plain, htp_capture, htp_inf, host_plain, host_capture, total = [], [], [], [], [], []
    for _ in range(rounds):
        t, plain = timed(lambda: runner.run(qdq, feeds, "htp"))
        htp_plain.append(t)
        t, capture = timed(lambda: runner.run(exposed, feeds, "htp"))
        htp_capture.append(t)
        htp_inf.append(sum(capture.inference_s) / sum(plain.inference_s))
        host_plain.append(timed(lambda: (run_host(float_model, feeds), run_host(qdq, feeds)))[0])
        host_capture.append(timed(lambda: (ei.float_activations(float_model, feeds, cache),
                                           ei.host_quantized_activations(exposed, tensors, feeds)))[0])
        total.append(timed(lambda: ei.isolate_errors(float_model, qdq, ob.dataset(), runner, ob.ptq(), cache,
                                                     samples=samples))[0])
    med = statistics.median
    print(f"{blocks:3d} blocks: {nodes} float nodes, {len(tensors)} tensors compared, {samples} samples")
    print(f"    htp : one plain inference pass {med(htp_plain):6.3f} s, error-isolation capture {med(htp_capture):6.3f} s"
          f"  -> ratio {med(htp_capture) / med(htp_plain):4.2f} (compute only: {med(htp_inf):4.2f})")
    print(f"    host: plain float + QDQ passes {med(host_plain):6.3f} s, error-isolation capture {med(host_capture):6.3f} s"
          f"  -> ratio {med(host_capture) / med(host_plain):4.2f}")
    print(f"    whole error-isolation step {med(total):6.3f} s = {med(total) / med(htp_plain):4.2f} x one plain htp pass "
          "(host float + host QDQ + device htp passes, comparison and plot)")
    print(f"    (one run per compared tensor instead would take ~{len(tensors)} x {med(htp_plain):.3f} s "
          f"= {len(tensors) * med(htp_plain):.0f} s on htp)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="+", default=[20, 60], help="residual blocks (5 nodes each)")
    parser.add_argument("--samples", type=int, default=4, help="evaluation samples compared (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per model (median reported)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    devices = load_devices_file(REPO / "devices.yaml")
    dev = devices.select(["sm8650-emu"])[0]
    with tempfile.TemporaryDirectory(prefix="bench-ei-") as tmp:
        work = Path(tmp)
        cache = ArtifactCache(work / "cache")
        transport = open_transport(dev, devices.soc(dev.soc), work / "emulator")
        runner = DeviceRunner(transport)
        try:
            for blocks in args.blocks:
                bench(blocks, args.samples, args.rounds, work, cache, runner, devices)
        finally:
            transport.close()


if __name__ == "__main__":
    main()
