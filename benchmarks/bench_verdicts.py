"""How often is a verdict noise, and how often is a real regression caught? Verdict stability, measured.

For each model (the built-in digits_cnn and two corpus models by default) the benchmark saves a baseline
(`--save-baseline`) on a quiet machine, then runs the onboarding suites unchanged `--runs` times against it
(`--baseline`), half of them quiet and half with a CPU-bound process beside them, and reads each run's
`--kpi-json`: a step that *failed* in an unchanged run is a false alarm, and a step whose outcome differs
from the baseline run's is a flip. Then it plants regressions and counts how often each is caught:

* `slow-device`: the same model on a device whose emulated HTP is 1.5x slower (its thermal model throttles
  from the start: `throttle_trip_c: 30, throttle_clear_c: 20, throttle_factor: 1.5`); caught when the
  `regression` step fails naming latency;
* `worse-recipe`: the same model quantized with worse encodings (the harness's own PTQ encodings with every
  activation range clipped to `--clip` of itself, through `--quantization-overrides`), checked to cost at
  least 5 % of the task metric; caught when `ptq` or `regression` fails naming the task metric.

It prints per step the outcomes of the unchanged runs (passed / marginal / inconclusive / failed / skipped)
and the flips, then the false-alarm rate (unchanged runs with any failed step) and the detection rate
(planted runs caught), each with its Wilson interval.

    python benchmarks/bench_verdicts.py [--runs 10] [--planted 10] [--models digits_cnn,ppocrv5_cls,mtcnn_pnet]
        [--soak-duration 15] [--suites all|fast] [--work DIR]

Each run's KPI JSON is kept in --work; run again with the same --work and the runs already there are reused
(an interrupted benchmark resumes where it stopped).

`--suites fast` runs the accuracy, profile, Step 7 and regression suites only (no sweep, mixed precision or
AIMET: they only run when PTQ misses), which is what a regression gate reads.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FAST_SUITES = ["suites/test_01_feasibility.py", "suites/test_02_conversion.py", "suites/test_04_ptq.py",
               "suites/test_08_context_binary.py", "suites/test_09_profile.py", "suites/test_12_sustained.py",
               "suites/test_13_energy.py", "suites/test_14_concurrency.py", "suites/test_15_regression.py"]
SLOW_DEVICE = {"throttle_trip_c": 30, "throttle_clear_c": 20, "throttle_factor": 1.5}
MIN_PLANTED_DROP = 0.05


@contextmanager
def cpu_load(active: bool):
    """Run a CPU-bound process beside the block when active."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if active else None
    try:
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def model_arg(name: str) -> str:
    """Return the --model value for a zoo name or a corpus model name."""
    from harness.corpus import default_dir, spec_path

    spec = spec_path(default_dir(), name)
    return str(spec) if spec.is_file() else name


def run_suites(model: str, work: Path, tag: str, args, extra: list[str], devices_file: Path | None = None) -> dict:
    """Run the suites once; return {step: (outcome, message, kpis)} from its --kpi-json."""
    kpi_json = work / f"{tag}.json"
    if kpi_json.is_file():  # a run an interrupted benchmark finished in the same --work: resumed, not re-run
        print(f"  {tag}: reused from {kpi_json}", flush=True)
        return _outcomes(kpi_json)
    suites = FAST_SUITES if args.suites == "fast" else ["suites/"]
    cmd = [sys.executable, "-m", "pytest", *suites, "-q", "-p", "no:cacheprovider", "--device", "sm8650",
           "--model", model_arg(model), "--kpi-json", str(kpi_json), "-m", "not llm",
           "--soak-duration", str(args.soak_duration), *extra]
    env = dict(os.environ)
    if devices_file is not None:
        env["HARNESS_DEVICES_FILE"] = str(devices_file)
    started = time.monotonic()
    partial = kpi_json.with_suffix(".partial.json")  # renamed into place once complete, so a resume trusts it
    cmd[cmd.index(str(kpi_json))] = str(partial)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if not partial.is_file():
        raise SystemExit(f"{tag}: no KPI JSON (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    partial.replace(kpi_json)
    print(f"  {tag}: exit {proc.returncode} in {time.monotonic() - started:.0f} s", flush=True)
    return _outcomes(kpi_json)


def _outcomes(kpi_json: Path) -> dict:
    """Return {step: (outcome, message, kpis)} of a --kpi-json file."""
    records = json.loads(kpi_json.read_text())["records"]
    return {r["step"]: (r["outcome"], r.get("message", ""), r.get("kpis", {})) for r in records}


def slow_devices_file(work: Path) -> Path:
    """Write a devices file whose sm8650 emulator's HTP is 1.5x slower from the start."""
    import yaml

    path = work / "slow-devices.yaml"
    path.write_text(yaml.safe_dump({"socs": {"sm8650": {"thermal": SLOW_DEVICE}},
                                    "devices": [{"id": "sm8650-emu", "soc": "sm8650", "transport": "emulator"}]}))
    return path


def worse_encodings(model: str, work: Path, clip: float) -> Path:
    """Write the harness's own PTQ encodings of model with every activation range clipped to `clip` of itself."""
    from dataclasses import replace

    from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache
    from harness.devices import load_devices_file
    from harness.quantization.export import export_encodings, write_encodings
    from harness.models import resolve_models
    from harness.pipeline import Onboarding, Target
    from harness.runner.client import DeviceRunner
    from harness.transports import open_transport

    cache = ArtifactCache(Path(os.environ.get("HARNESS_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser())
    devices = load_devices_file(None)
    device = devices.select(["sm8650"])[0]
    spec = resolve_models([model_arg(model)], [], [], None)[0]
    transport = open_transport(device, devices.soc(device.soc), cache.root / "emulator")
    try:
        onboarding = Onboarding(Target(device, devices.soc(device.soc), spec), DeviceRunner(transport), cache)
        encodings = export_encodings(onboarding.qdq_model())
    finally:
        transport.close()
    clipped = {name: [replace(e, scale=e.scale * clip) for e in encs] for name, encs in encodings.activations.items()}
    return write_encodings(replace(encodings, activations=clipped), work / f"{model}-worse.json")


def wilson(successes: int, n: int) -> str:
    """Return 'k/n = p [low, high]' with the 95 % Wilson interval."""
    from harness.stats import wilson as interval

    if n == 0:
        return "0/0"
    ci = interval(successes, n)
    return f"{successes}/{n} = {successes / n:.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def caught(result: dict, steps: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """Return whether one of steps failed with a message naming one of words."""
    return any(result.get(step, ("",))[0] == "failed" and any(w in result[step][1] for w in words) for step in steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="unchanged runs per model (half quiet, half loaded)")
    parser.add_argument("--planted", type=int, default=10, help="runs per planted regression and model")
    parser.add_argument("--models", default="digits_cnn,ppocrv5_cls,mtcnn_pnet")
    parser.add_argument("--soak-duration", type=float, default=15.0)
    parser.add_argument("--suites", choices=("all", "fast"), default="fast")
    parser.add_argument("--clip", type=float, default=0.3, help="worse-recipe: activation ranges clipped to this")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-verdicts-"))
    work.mkdir(parents=True, exist_ok=True)
    from harness.models import ZOO_MODELS

    unknown = [m for m in args.models.split(",") if not Path(model_arg(m)).is_file() and m not in ZOO_MODELS]
    if unknown:  # before hours of runs, not after the first model's
        raise SystemExit(f"not a built-in model nor a fetched corpus model: {', '.join(unknown)} "
                         "(`python -m harness corpus fetch` fetches the corpus)")
    print(f"work directory {work}; {args.runs} unchanged and {args.planted} planted runs per model and plant")
    outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    flips: collections.Counter = collections.Counter()
    false_alarms, unchanged = [], 0
    detections: dict[str, list[bool]] = collections.defaultdict(list)
    drops = []
    for model in args.models.split(","):
        print(f"{model}:", flush=True)
        baseline_dir = work / model / "baseline"
        reference = run_suites(model, work / model, "baseline", args, ["--save-baseline", str(baseline_dir)])
        for k in range(args.runs):
            loaded = k % 2 == 1
            with cpu_load(loaded):
                result = run_suites(model, work / model, f"unchanged-{k}{'-loaded' if loaded else ''}", args,
                                    ["--baseline", str(baseline_dir)])
            unchanged += 1
            failed = sorted(step for step, (outcome, _, _) in result.items() if outcome == "failed")
            if failed:
                false_alarms.append((model, k, loaded, {s: result[s][1].splitlines()[0][:160] for s in failed}))
            for step, (outcome, _, _) in result.items():
                outcomes[step][outcome] += 1
                if step in reference and reference[step][0] not in ("skipped", outcome):  # (regression: no baseline then)
                    flips[step] += 1
        slow = slow_devices_file(work / model)
        for k in range(args.planted):
            result = run_suites(model, work / model, f"slow-device-{k}", args, ["--baseline", str(baseline_dir)],
                                devices_file=slow)
            detections["slow-device"].append(caught(result, ("regression",), ("latency",)))
        worse = worse_encodings(model, work / model, args.clip)
        for k in range(args.planted):
            result = run_suites(model, work / model, f"worse-recipe-{k}", args,
                                ["--baseline", str(baseline_dir), "--quantization-overrides", str(worse)])
            ptq_kpis = result.get("ptq", ("", "", {}))[2]
            base_kpis = reference.get("ptq", ("", "", {}))[2]
            if "task_metric" in ptq_kpis and "task_metric" in base_kpis:
                drops.append((model, base_kpis["task_metric"] - ptq_kpis["task_metric"]))
            detections["worse-recipe"].append(caught(result, ("ptq", "regression"), ("task_metric",)))
    print("\nunchanged runs, outcomes per step (flips: outcome differs from the baseline run's)")
    print(f"{'step':24} {'passed':>7} {'marginal':>8} {'inconcl.':>8} {'failed':>7} {'skipped':>7} {'flips':>6}")
    for step in sorted(outcomes):
        c = outcomes[step]
        print(f"{step:24} {c['passed']:7} {c['marginal']:8} {c['inconclusive']:8} {c['failed']:7} "
              f"{c['skipped']:7} {flips[step]:6}")
    print(f"\nfalse alarms (unchanged runs with a failed step): {wilson(len(false_alarms), unchanged)}")
    for model, k, loaded, failed in false_alarms:
        print(f"  {model} run {k}{' (loaded)' if loaded else ''}: {failed}")
    for plant, hits in detections.items():
        print(f"detection, {plant}: {wilson(sum(hits), len(hits))}")
    for model, drop in drops[:len(args.models.split(","))]:
        note = "" if drop >= MIN_PLANTED_DROP else f" (below the {MIN_PLANTED_DROP:g} a plant must cost)"
        print(f"worse-recipe task metric drop on {model}: {drop:.3f}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
