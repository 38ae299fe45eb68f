"""Step 6, runtime integration: the compiled context binary pushed to the device and run there
by the device-side runner (as qnn-net-run would), against the host's own HTP run of the same
artifact with the same provider options.

On the emulator the "device" is the emulator transport's sandbox and a separate runner process;
on hardware it is the phone's or board's HTP, and the host side is the HTP simulator, whose
numerics are the HTP's, so the outputs should agree to within rounding. `executed_on` is the
device run's RunResult.latency_source: 'simulator' wherever the runner ran on an x86-64 machine
(emulator, an x86-64 SSH host, the emulated adb phone), 'device' on an aarch64/ARM64 HTP.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from harness.data import Feed
from harness.devices import SocSpec
from harness.errors import StepError
from harness.kpi import Limit
from harness.metrics import cosine_similarity, max_abs_diff
from harness.runner.base import CONTEXT_SIDECAR
from harness.runner.client import DeviceRunner, check_context_target
from harness.steps.context_binary import ContextBinary, host_htp_session
from harness.steps.inference import stacked
from harness.steps.report import StepReport

RUNTIME_SAMPLES = 8
RUNTIME_BUDGET_S = 30.0  # device time for the samples of a slow shipped model (16-bit activations, FP16)
MIN_RUNTIME_SAMPLES = 2

MIN_COSINE = 0.9999  # same artifact, same numerics: anything lower is an integration fault
MAX_ABS_DIFF_OF_RANGE = 0.01  # allowed largest difference, as a fraction of the host outputs' range


def runtime_samples(inference_s: float | None, available: int = RUNTIME_SAMPLES) -> tuple[int, str]:
    """Return how many of the available samples the runtime step runs at inference_s per inference of the shipped
    model (its measured cost; None: unknown) and why: RUNTIME_SAMPLES, or as many as fit RUNTIME_BUDGET_S (at
    least MIN_RUNTIME_SAMPLES) when RUNTIME_SAMPLES would take longer."""
    if not inference_s or inference_s * RUNTIME_SAMPLES <= RUNTIME_BUDGET_S:
        count, why = RUNTIME_SAMPLES, f"{RUNTIME_SAMPLES} samples (the step's)"
    else:
        count = max(MIN_RUNTIME_SAMPLES, int(RUNTIME_BUDGET_S // inference_s))
        why = (f"{count} samples instead of {RUNTIME_SAMPLES}: one HTP inference of the shipped model took "
               f"{inference_s:.3g} s, so {count} fit the step's budget of {RUNTIME_BUDGET_S:g} s "
               f"(minimum {MIN_RUNTIME_SAMPLES})")
    if available < count:
        return available, f"{available}, all the evaluation samples (the step would run {why})"
    return count, why


def host_run(ctx: ContextBinary, feeds: list[Feed], soc: SocSpec) -> list[Feed]:
    """Return the outputs of the context binary in an in-process host session on the QNN EP."""
    try:
        session = host_htp_session(ctx.model, soc)
    except StepError:
        raise
    except Exception as e:
        raise StepError(f"the host cannot load context binary {ctx.model.name}: {type(e).__name__}: {e}") from None
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, feed))) for feed in feeds]


def runtime(ctx: ContextBinary, feeds: list[Feed], runner: DeviceRunner,
            inference_s: float | None = None) -> StepReport:
    """Return the Step 6 report: the context binary run on the device vs the host's run of it, on as many
    samples as runtime_samples gives for inference_s (the shipped model's measured cost per inference).

    Raises ContextMismatchError (naming both SoCs) when the binary was compiled for another SoC
    than the device's; it is never recompiled or run.
    """
    soc = runner.transport.soc
    check_context_target(ctx.model, soc, runner.transport.device_id)
    count, why = runtime_samples(inference_s, len(feeds))
    samples = feeds[:count]
    with ThreadPoolExecutor(1, thread_name_prefix="host-htp") as pool:  # the host's run overlaps the device's
        host_run_ = pool.submit(host_run, ctx, samples, soc)
        device = runner.run(ctx.model, samples, "htp")
        host = host_run_.result()
    ref, out = stacked(host), stacked(device.outputs, host)
    spread = max((float(np.ptp(np.asarray(r))) for r in ref), default=0.0)
    report = StepReport("runtime")
    report.kpis = {
        "runtime": "htp",
        "artifact": ctx.model.name,
        "shipped_files": [*(p.name for p in ctx.files), CONTEXT_SIDECAR],
        "soc": soc.id,
        "samples": len(device.outputs),
        "samples_reason": why,
        "cosine_similarity": cosine_similarity(ref, out),
        "max_abs_diff": max_abs_diff(ref, out),
        "bit_exact": all(np.array_equal(np.asarray(r), np.asarray(o)) for r, o in zip(ref, out)),
        "device_load_s": float(device.report.get("session_create_s", device.load_s)),
        "htp_nodes": sum(p.on_htp for p in device.placement),
        "executed_on": device.latency_source,
    }
    report.notes.extend(device.notes)  # e.g. a qnn-net-run device that reported no timings
    report.limits = [Limit("cosine_similarity", minimum=MIN_COSINE, marginal=0.0),
                     Limit("max_abs_diff", maximum=MAX_ABS_DIFF_OF_RANGE * spread if spread else 1e-6)]
    return report
