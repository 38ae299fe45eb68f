"""What does task evaluation add to the PTQ step? Its wall time against the step's, measured in the same run.

Per corpus model whose spec has an `evaluation:` section (labelled data, a post-processing and a task metric:
cer, hmean, map50, f1, detection_rate, top1 ...), builds the pipeline on an emulated device, warms the PTQ
step's prerequisites so that they are not counted (conversion, the evaluation set's sizing and its timed
inference, calibration and quantization, the float reference on the host; and the imports of the post-processing's
and the metric's libraries, shapely, scipy.ndimage, rapidfuzz ..., which a suite's float_baseline step has paid
before PTQ), then runs `Onboarding.ptq()` once and prints, side by side:

* the PTQ step's wall time (the QDQ model's device run, the comparisons, the report);
* the wall time spent inside the task evaluation during it (harness.evaluation.task.TaskEvaluation's `compare`
  and `value`, with what they call: post-processing, the metric, its intervals; nested calls counted once),
  and its share of the PTQ step's wall time (goal: at most 20 %);
* the host QDQ run (harness.steps.inference.host_qdq_run) PTQ does only when a task evaluation is set, apart:
  it runs on a thread beside the device run, so it overlaps it rather than adding to it (it adds what it
  takes beyond the device run, and the CPU it takes from it on a small machine).

The last line gives the worst share.

    python benchmarks/bench_task_eval.py [--models ppocrv5_rec silero_vad ...] [--device sm8650-emu]
        [--corpus DIR] [--cache-dir DIR]

By default every fetched corpus model with an evaluation section runs (nine; about 4 minutes on a 2-core machine
with a fresh cache, layout_cdla's prerequisites the longest at about a minute, its PTQ step under 20 s: none is left
out). With --cache-dir the prerequisites are reused between runs (only the PTQ step is measured either way).
"""

from __future__ import annotations

import argparse
import functools
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
from harness.evaluation.task import TaskEvaluation  # noqa: E402
from harness.models import resolve_model  # noqa: E402
from harness.pipeline import Onboarding, Target  # noqa: E402
from harness.runner.client import DeviceRunner  # noqa: E402
from harness.steps import ptq as ptq_step  # noqa: E402
from harness.transports import open_transport  # noqa: E402

GOAL_SHARE = 0.20
TIMED_METHODS = ("compare", "value")  # TaskEvaluation's entry points the steps call


class Timer:
    """Wall time spent inside timed calls: a call made from inside another (on the same thread) counts once."""

    def __init__(self) -> None:
        self._depth = threading.local()
        self._lock = threading.Lock()
        self.total_s = 0.0
        self.calls = 0

    @contextmanager
    def timing(self):
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                with self._lock:
                    self.total_s += time.perf_counter() - start
                    self.calls += 1

    def wrap(self, function):
        """Return function timed by this timer."""
        @functools.wraps(function)
        def timed(*args, **kwargs):
            with self.timing():
                return function(*args, **kwargs)
        return timed


@contextmanager
def timed(owner, names: tuple[str, ...], timer: Timer):
    """For the block, replace owner's attributes `names` with timer-wrapped ones (restored after)."""
    saved = {name: owner.__dict__[name] for name in names}
    try:
        for name, function in saved.items():
            setattr(owner, name, timer.wrap(function))
        yield timer
    finally:
        for name, function in saved.items():
            setattr(owner, name, function)


def has_evaluation(root: Path, name: str) -> bool:
    """Return whether corpus model `name` is fetched and its spec has an evaluation section."""
    spec = corpus.spec_path(root, name)
    return spec.is_file() and resolve_model(str(spec), {}, None).evaluation is not None


def warm(ob: Onboarding) -> float:
    """Build what PTQ needs before it runs its device run, and import what its task evaluation's first call would
    (one sample post-processed and scored outside TaskEvaluation, so that no timed call pays them: a suite's
    float_baseline step pays these imports before PTQ); return the seconds it took."""
    start = time.perf_counter()
    ob.conversion()
    ob.inference_cost()  # sizes the evaluation set
    data = ob.dataset()
    ob.qdq_model()
    reference = ob.float_reference()
    task = data.task
    task.metric.value([task.postprocess(reference[0])], task.parsed(data.labels[:1]))
    return time.perf_counter() - start


def bench(name: str, root: Path, device_id: str, devices, cache: ArtifactCache, work: Path) -> dict:
    """Run one model's PTQ step with its task evaluation and host QDQ run timed; print and return its row."""
    model = resolve_model(str(corpus.spec_path(root, name)), {}, None)
    dev = devices.select([device_id])[0]
    transport = open_transport(dev, devices.soc(dev.soc), work / "emulator")
    runner = DeviceRunner(transport)
    row = {"model": name}
    try:
        ob = Onboarding(Target(dev, devices.soc(dev.soc), model), runner, cache)
        try:
            row["warm_s"] = warm(ob)
            task, host = Timer(), Timer()
            with timed(TaskEvaluation, TIMED_METHODS, task), timed(ptq_step, ("host_qdq_run",), host):
                start = time.perf_counter()
                report = ob.ptq()
                row["ptq_s"] = time.perf_counter() - start
        except HarnessError as e:
            row["error"] = str(e).splitlines()[0][:160]
            print(f"  {name}: {row['error']}", flush=True)
            return row
        k = report.kpis
        row.update(samples=k.get("samples"), metric=k.get("task_metric_name", "?"), value=k.get("task_metric"),
                   task_s=task.total_s, task_calls=task.calls, host_s=host.total_s,
                   outcome="passed" if report.passed else ("inconclusive" if report.inconclusive else "failed"))
        print(f"  {name}: prerequisites {row['warm_s']:.1f} s (not counted); PTQ {row['ptq_s']:.2f} s, of it task "
              f"evaluation {row['task_s']:.2f} s in {row['task_calls']} call(s), host QDQ {row['host_s']:.2f} s "
              f"(overlapping the device run); {row['outcome']}", flush=True)
        return row
    finally:
        runner.close()
        transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None,
                        help="corpus models (default: all fetched with an evaluation section)")
    parser.add_argument("--device", default="sm8650-emu", help="device id (default sm8650-emu)")
    parser.add_argument("--corpus", default=None, help="corpus directory (default: the fetcher's)")
    parser.add_argument("--cache-dir", default=None, help="artifact cache (default: a fresh one)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    root = Path(args.corpus) if args.corpus else corpus.default_dir()
    if args.models:
        names = args.models
        missing = [n for n in names if not corpus.spec_path(root, n).is_file()]
        if missing:
            sys.exit(f"not fetched: {', '.join(missing)}; run `python -m harness corpus fetch`")
        if without := [n for n in names if not has_evaluation(root, n)]:
            sys.exit(f"no evaluation section in the spec of: {', '.join(without)}")
    else:
        names = [n for n in dict.fromkeys(corpus.load_manifest().models) if has_evaluation(root, n)]
        print(f"models with an evaluation section: {', '.join(names)}", flush=True)
    devices = load_devices_file(REPO / "devices.yaml")
    with tempfile.TemporaryDirectory(prefix="bench-task-eval-") as tmp:
        work = Path(tmp)
        cache = ArtifactCache(Path(args.cache_dir) if args.cache_dir else work / "cache")
        rows = [bench(name, root, args.device, devices, cache, work) for name in names]
    print(f"\n{'model':18s} {'samples':>7s} {'metric':>20s} {'PTQ wall s':>10s} {'task eval s':>11s} "
          f"{'share':>6s} {'host QDQ s':>10s}  outcome")
    measured = [r for r in rows if "error" not in r]
    for r in rows:
        if "error" in r:
            print(f"{r['model']:18s} error: {r['error']}")
            continue
        metric = f"{r['metric']} {r['value']:.3f}" if isinstance(r["value"], float) else str(r["metric"])
        share = r["task_s"] / r["ptq_s"]
        print(f"{r['model']:18s} {r['samples']:7d} {metric:>20s} {r['ptq_s']:10.2f} {r['task_s']:11.2f} "
              f"{100 * share:5.1f}% {r['host_s']:10.2f}  {r['outcome']}{'  OVER 20 %' if share > GOAL_SHARE else ''}")
    if measured:
        worst = max(measured, key=lambda r: r["task_s"] / r["ptq_s"])
        share = worst["task_s"] / worst["ptq_s"]
        print(f"worst share: {100 * share:.1f} % ({worst['model']}); goal: task evaluation at most "
              f"{100 * GOAL_SHARE:.0f} % of the PTQ step's wall time: {'met' if share <= GOAL_SHARE else 'NOT met'}")


if __name__ == "__main__":
    main()
