"""The default suite on the real-model corpus: wall time per step, the device runner's share, folding.

Per corpus model (fetched with `python -m harness corpus fetch`), runs every onboarding step through
the pipeline on an emulated device (cold cache unless --cache-dir) and prints, side by side:

* wall time per step and in total (goal: under 10 minutes per model on a 2-core machine);
* the share of that time spent inside the device runner (the DeviceRunner's calls: pushing,
  starting the runner, the HTP simulator, pulling results; overlapping calls of the sweep's
  threads counted once) against the harness's own work (conversion, quantization, host references
  including the runtime step's host run of the context binary, comparisons, reports); the harness's
  overhead on top of the device runs, goal < 10 % — host-side quantization and host references are work
  a user needs too, so they are shown apart; the process's
  start-up (importing onnx, onnxruntime, matplotlib ...), paid once per run, is timed before the first
  model and printed apart too;
* the conversion's folding: the 8-bit QDQ form of the shape-fixed (un-folded) model against the
  converted (folded) one on the HTP: nodes placed on the HTP, total nodes, and mean inference ms.

    python benchmarks/bench_real_models.py [--models ppocrv5_cls mtcnn_rnet ...] [--device sm8650]
        [--corpus DIR] [--cache-dir DIR] [--no-folding]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from harness import corpus  # noqa: E402
from harness.cache import ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.errors import HarnessError  # noqa: E402
from harness.models import resolve_model  # noqa: E402
from harness.pipeline import Onboarding, Target  # noqa: E402
from harness.reporting import charts  # noqa: E402
from harness.runner.client import DeviceRunner  # noqa: E402
from harness.steps import profile as profile_step  # noqa: E402
from harness.steps import ptq  # noqa: E402
from harness.steps import runtime as runtime_step  # noqa: E402
from harness.transports import open_transport  # noqa: E402

STEPS = ("feasibility", "conversion", "float_baseline", "ptq", "error_isolation", "sweep", "mixed_precision",
         "aimet", "context_binary", "profile", "runtime")
SHOWN_KPIS = ("nodes_on_htp", "nodes_total", "nodes_before", "nodes_after", "equivalence_cosine", "cosine_similarity",
              "sqnr_db", "best", "promoted")
GATES = {"feasibility", "conversion"}  # the suite skips the steps needing these (float_baseline needs only conversion)


class Activity:
    """Wall time during which at least one call of a category is active (threads overlapping counted
    once), per category and for all categories together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self.busy_s: dict[str, float] = {}

    @contextmanager
    def busy(self, category: str):
        with self._lock:
            for key in (category, "*"):
                if self._active.get(key, 0) == 0:
                    self._since[key] = time.perf_counter()
                self._active[key] = self._active.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for key in (category, "*"):
                    self._active[key] -= 1
                    if self._active[key] == 0:
                        self.busy_s[key] = self.busy_s.get(key, 0.0) + time.perf_counter() - self._since[key]

    def total(self, category: str) -> float:
        """Seconds during which category (or '*': anything) was active."""
        return self.busy_s.get(category, 0.0)


ACTIVITY = Activity()
# Cache builds that are host work a user's own flow needs too (no device runs inside): conversion,
# quantization and calibration, host references and QDQ emulation, context-binary compilation.
HOST_KINDS = {"fixed": "conversion", "converted": "conversion", "qdq": "quantization",
              "entropy_ranges": "quantization", "host_reference": "host inference", "debug_float": "host inference",
              "exposed": "host inference", "mp_host_eval": "host inference", "context_binary": "compilation",
              "opset": "conversion", "encodings": "quantization", "aimet": "AIMET recovery"}


class TimedCache(ArtifactCache):
    """An ArtifactCache that records the time spent building host-work entries (HOST_KINDS)."""

    def entry(self, kind, key, build):
        category = HOST_KINDS.get(kind)
        if category is None:
            return super().entry(kind, key, build)

        def timed_build(out):
            with ACTIVITY.busy(category):
                build(out)
        return super().entry(kind, key, timed_build)


def timed_host_run(host_run):
    """Return host_run (the runtime step's host reference run of the context binary on the host's HTP: what the
    device's outputs are checked against, as a user's integration check needs) timed as host inference."""
    def run(*args, **kwargs):
        with ACTIVITY.busy("host inference"):
            return host_run(*args, **kwargs)
    return run


runtime_step.host_run = timed_host_run(runtime_step.host_run)


class TimedRunner(DeviceRunner):
    """A DeviceRunner whose run() calls count as device time; it also adds up the time the runner
    process itself reported (session creation + inferences + measurement loops)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inside_s = 0.0
        self._lock = threading.Lock()

    def run(self, *args, **kwargs):
        with ACTIVITY.busy("device runner"):
            result = super().run(*args, **kwargs)
        with self._lock:
            self.inside_s += result.load_s + sum(result.inference_s) + result.measured_s
        return result

    @property
    def busy_s(self) -> float:
        return ACTIVITY.total("device runner")


def share(part: float, whole: float) -> str:
    """Return part as a percentage of whole, or 'n/a' when whole is nothing (no device run: a refused model)."""
    return f"{100 * part / whole:.0f} %" if whole > 0.05 else "n/a (no device run)"


def run_step(ob: Onboarding, step: str):
    """Return (outcome, message) of one step called on the pipeline."""
    try:
        if step == "profile":
            report = ob.profile(profile_step.default_rule(ob.target.device.transport))
        else:
            report = getattr(ob, step)()
    except HarnessError as e:
        return "error", str(e).splitlines()[0]
    k = report.kpis
    shown = ", ".join(f"{key} {k[key]:.4g}" if isinstance(k[key], float) else f"{key} {k[key]}"
                      for key in SHOWN_KPIS if key in k)
    outcome = "passed" if report.passed else "failed"
    return outcome, shown if report.passed else "; ".join(report.failures)[:160]


def folding(ob: Onboarding, runner: DeviceRunner) -> str:
    """Return the HTP node counts and mean ms of the un-folded vs folded model's 8-bit QDQ form."""
    feeds = ob.calibration()[:1]
    cells = []
    for label, model in (("un-folded", ob.fixed_model()), ("folded", ob.converted_model())):
        try:
            qdq = ptq.quantize(model, ob.calibration(), ptq.QuantRecipe(), ob.cache)
            run = runner.run(qdq, feeds, "htp", allow_cpu_fallback=True, warmup=1, min_iterations=3)
        except HarnessError as e:
            cells.append(f"{label}: {str(e).splitlines()[0][:100]}")
            continue
        on_htp = sum(p.on_htp for p in run.placement)
        mean_ms = 1000 * sum(run.iteration_s) / max(1, len(run.iteration_s))
        cells.append(f"{label}: {on_htp}/{len(run.placement)} nodes on HTP, {mean_ms:.1f} ms")
    return " | ".join(cells)


def bench(name: str, root: Path, device_id: str, devices, cache: ArtifactCache, work: Path,
          with_folding: bool) -> tuple[str, float, float, float, float]:
    """Run and print one model; return (name, wall s, device-runner s, host work s, own overhead s)."""
    spec_file = corpus.spec_path(root, name)
    model = resolve_model(str(spec_file), {}, None)
    dev = devices.select([device_id])[0]
    transport = open_transport(dev, devices.soc(dev.soc), work / "emulator")
    runner = TimedRunner(transport)
    ob = Onboarding(Target(dev, devices.soc(dev.soc), model), runner, cache)
    rows, total_start = [], time.perf_counter()
    host0 = {c: ACTIVITY.total(c) for c in set(HOST_KINDS.values())}
    any0, busy_start = ACTIVITY.total("*"), ACTIVITY.total("device runner")
    skip = ""
    try:
        for step in STEPS:
            if skip and step not in GATES and not (step == "float_baseline" and "feasibility" in skip):
                rows.append((step, 0.0, 0.0, "skipped", skip))
                continue
            busy0, start = ACTIVITY.total("device runner"), time.perf_counter()
            outcome, message = run_step(ob, step)
            rows.append((step, time.perf_counter() - start, ACTIVITY.total("device runner") - busy0, outcome, message))
            if step in GATES and outcome != "passed":
                skip = skip or f"{step} did not pass"
        charts.wait_all()  # the charts drawn on their own thread count in the model's wall time
        wall, busy, inside = (time.perf_counter() - total_start, ACTIVITY.total("device runner") - busy_start,
                              runner.inside_s)
        print(f"\n== {name} on {device_id}: {wall:.1f} s in total, {busy:.1f} s inside the device runner "
              f"({inside:.1f} s measured by the runner process itself)")
        with contextlib.suppress(HarnessError):
            print(f"   data: {(ob.full_dataset() if skip else ob.dataset()).description}")
        print(f"   {'step':16s} {'wall s':>8s} {'runner s':>9s} {'harness s':>9s}  outcome")
        for step, wall_s, busy_s, outcome, message in rows:
            print(f"   {step:16s} {wall_s:8.1f} {busy_s:9.1f} {wall_s - busy_s:9.1f}  {outcome}"
                  f"{': ' + message if message else ''}")
        host = {c: ACTIVITY.total(c) - host0.get(c, 0.0) for c in sorted(set(HOST_KINDS.values()))}
        anything = ACTIVITY.total("*") - any0
        overhead = wall - anything
        print(f"   outside the device runner: {wall - busy:.1f} s = {share(wall - busy, busy)} on top "
              f"of the device runs; of it host work a user's flow needs too: "
              + ", ".join(f"{c} {t:.1f} s" for c, t in host.items() if t >= 0.05)
              + f"; the harness's own overhead (staging, comparing, reporting): {overhead:.1f} s = "
              f"{share(overhead, busy)} (goal < 10 %); {'within' if wall < 600 else 'OVER'} 10 minutes")
        if with_folding and not skip:
            print(f"   folding (QDQ form on the HTP): {folding(ob, runner)}")
        return name, wall, busy, anything - busy, overhead
    finally:
        runner.close()
        transport.close()


def start_up() -> float:
    """Import the libraries every model's steps use (what a pytest session pays once, at its first step); return
    the seconds it took, so that the first model's figures do not carry the process's start-up."""
    started = time.perf_counter()
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401  (the charts' Figure: 0.25 s, else paid on the chart thread by the first chart)
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import onnxruntime.quantization  # noqa: F401
    import onnxslim  # noqa: F401
    import scipy.stats  # noqa: F401
    with contextlib.suppress(ImportError):  # the AIMET step's library, when installed (it brings torch)
        import aimet_onnx  # noqa: F401
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, help="corpus models (default: all)")
    parser.add_argument("--device", default="sm8650-emu", help="device id (default sm8650-emu)")
    parser.add_argument("--corpus", default=None, help="corpus directory (default: the fetcher's)")
    parser.add_argument("--cache-dir", default=None, help="artifact cache (default: a fresh one: cold run)")
    parser.add_argument("--no-folding", dest="folding", action="store_false", help="skip the folding comparison")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    names = args.models or list(corpus.load_manifest().models)
    root = Path(args.corpus) if args.corpus else corpus.default_dir()
    missing = [n for n in names if not corpus.spec_path(root, n).is_file()]
    if missing:
        sys.exit(f"not fetched: {', '.join(missing)}; run `python -m harness corpus fetch`")
    devices = load_devices_file(REPO / "devices.yaml")
    print(f"process start-up, once per run (not per model): {start_up():.1f} s importing onnx, onnxruntime, "
          "its quantizer, onnxslim, scipy, matplotlib and (when installed) aimet_onnx")
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        cache = TimedCache(Path(args.cache_dir) if args.cache_dir else work / "cache")
        summary = [bench(name, root, args.device, devices, cache, work, args.folding) for name in names]
    print(f"\n{'model':18s} {'wall s':>7s} {'runner s':>8s} {'host work s':>11s} {'overhead s':>10s} {'overhead %':>10s}")
    for name, wall, busy, host, overhead in summary:
        print(f"{name:18s} {wall:7.1f} {busy:8.1f} {host:11.1f} {overhead:10.1f} {share(overhead, busy):>10s}"
              f"{'  OVER 10 min' if wall >= 600 else ''}")
    total = sum(row[1] for row in summary)
    print(f"{'all':18s} {total:7.1f}  (goal: each model under 600 s; the harness's own overhead under 10 %)")


if __name__ == "__main__":
    main()
