"""The AIMET recovery step's cost per technique, and its accuracy per minute against the harness's own mixed precision.

For each zoo model (a fresh cache per model, so nothing comes from an earlier run), builds the prerequisites
(conversion, PTQ, error isolation, the quick sweep; not timed), then times, one after the other in the same
process on the emulated sm8650's HTP simulator:

* the harness's mixed precision (`Onboarding.mixed_precision`), from the sweep's best 8-bit recipe;
* the AIMET step (`Onboarding.aimet`, `--aimet on`), from the recipe mixed precision reached: per technique
  AIMET's own time (host) and the harness's quantization + HTP evaluation of its export.

Both are scored from the same start (the sweep's best 8-bit candidate on the HTP): output SQNR gained (dB)
per minute of wall time, and the time until the KPI was first met. Prints a table per model and the ratios
AIMET / mixed precision.

    python benchmarks/bench_aimet.py [--model digits_cnn digits_imbalanced]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from harness.cache import ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402
from harness.models import resolve_model  # noqa: E402
from harness.options import AccuracyOptions  # noqa: E402
from harness.pipeline import Onboarding, Target  # noqa: E402
from harness.runner.client import DeviceRunner  # noqa: E402
from harness.steps import aimet_recovery as ar  # noqa: E402
from harness.transports import open_transport  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def per_minute(gain_db: float, seconds: float) -> float:
    return gain_db / (seconds / 60) if seconds > 0 else float("inf")


def bench(name: str, devices, work: Path) -> dict:
    cache = ArtifactCache(work / name / "cache")
    dev = devices.select(["sm8650-emu"])[0]
    transport = open_transport(dev, devices.soc(dev.soc), work / name / "emulator")
    runner = DeviceRunner(transport)
    try:
        ob = Onboarding(Target(dev, devices.soc(dev.soc), resolve_model(name, {}, None)), runner, cache,
                        accuracy=AccuracyOptions(aimet="on"))
        prep_s, _ = timed(lambda: (ob.ptq(), ob.error_isolation(), ob.sweep()))
        start = ob._mixed_precision_start()
        mp_s, mixed = timed(ob.mixed_precision)
        aimet_s, report = timed(ob.aimet)
    finally:
        transport.close()
    base = start.kpis["sqnr_db"]
    rows = report.tables["techniques"]
    techniques = [r for r in rows if r["stage"].startswith("aimet ")]
    elapsed, met_at = 0.0, None
    for r in techniques:
        elapsed += (r["aimet_s"] or 0) + (r["htp_s"] or 0)
        if met_at is None and r["meets_kpi"]:
            met_at = elapsed
    k = report.kpis
    print(f"\n== {name}: prerequisites {prep_s:.1f} s; start {start.name} on the HTP: SQNR {base:.1f} dB, "
          f"cosine {start.kpis['cosine_similarity']:.4f}, meets KPI {start.meets}")
    print(f"{'stage':<22}{'top1':>7}{'cosine':>9}{'SQNR dB':>9}{'KPI':>6}  {'bits':<18}{'aimet s':>8}{'htp s':>7}")
    for r in rows:
        aimet_col = f"{r['aimet_s']:8.2f}" if r["aimet_s"] is not None else f"{'':>8}"
        htp_col = f"{r['htp_s']:7.2f}" if r["htp_s"] is not None else f"{'':>7}"
        print(f"{r['stage']:<22}{r['task_metric']:7.4f}{r['cosine_similarity']:9.4f}{r['sqnr_db']:9.2f}"
              f"{str(bool(r['meets_kpi'])):>6}  {str(r['bits'] or ''):<18}{aimet_col}{htp_col}")
    print(f"{'per-layer sensitivity':<22}{'':>31}  {'(2 analyses)':<18}{k['sensitivity_s']:8.2f}")
    mp_gain, aimet_gain = mixed.kpis["sqnr_db"] - base, k["sqnr_db"] - base
    result = {"model": name, "mp_s": mp_s, "mp_gain_db": mp_gain, "mp_met": mixed.kpis["met_threshold"],
              "aimet_s": aimet_s, "aimet_gain_db": aimet_gain, "aimet_met": k["met_threshold"], "aimet_met_at_s": met_at,
              "mp_db_per_min": per_minute(mp_gain, mp_s), "aimet_db_per_min": per_minute(aimet_gain, aimet_s)}
    print(f"mixed precision: {mp_s:6.1f} s, SQNR {base:.1f} -> {mixed.kpis['sqnr_db']:.1f} dB "
          f"({result['mp_db_per_min']:+.1f} dB/min), KPI met {mixed.kpis['met_threshold']}")
    print(f"AIMET step:      {aimet_s:6.1f} s, SQNR {base:.1f} -> {k['sqnr_db']:.1f} dB "
          f"({result['aimet_db_per_min']:+.1f} dB/min), KPI met {k['met_threshold']}"
          + (f" first by {k['met_by']} after {met_at:.1f} s of technique time" if met_at is not None else ""))
    if mp_s > 0:
        print(f"ratio AIMET / mixed precision: wall time {aimet_s / mp_s:.2f}x, "
              + (f"dB per minute {result['aimet_db_per_min'] / result['mp_db_per_min']:.2f}x"
                 if abs(result["mp_db_per_min"]) > 1e-9 else "dB per minute: mixed precision gained nothing"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["digits_cnn", "digits_imbalanced"])
    args = parser.parse_args()
    if (missing := ar.aimet_missing()) is not None:
        sys.exit(f"bench_aimet: {missing}")
    devices = load_devices_file(REPO / "devices.yaml")
    with tempfile.TemporaryDirectory(prefix="bench-aimet-") as tmp:
        results = [bench(name, devices, Path(tmp)) for name in args.model]
    print("\nmodel               MP s  MP dB/min  MP KPI   AIMET s  AIMET dB/min  AIMET KPI  to KPI s")
    for r in results:
        to_kpi = f"{r['aimet_met_at_s']:8.1f}" if r["aimet_met_at_s"] is not None else f"{'-':>8}"
        print(f"{r['model']:<18}{r['mp_s']:6.1f}{r['mp_db_per_min']:11.1f}{str(r['mp_met']):>8}{r['aimet_s']:10.1f}"
              f"{r['aimet_db_per_min']:14.1f}{str(r['aimet_met']):>11}{to_kpi}")


if __name__ == "__main__":
    main()
