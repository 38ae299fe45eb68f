"""What the two runners of a device share (the harness's device_runner.py, harness.runner.client, and Qualcomm's
qnn-net-run, harness.runner.qnn_net_run): the RunResult a run leaves, where its timings come from
(latency_source), and how a model and its feeds are staged on the device, in qnn-net-run's input-list layout.
"""

from __future__ import annotations

import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.data import Feed, feeds_digest
from harness.errors import ConfigError
from harness.files import external_data_files, model_digest
from harness.transports.base import Transport

CONTEXT_SIDECAR = "context.json"  # beside a compiled EPContext model: the SoC it was built for
HTP_EP = "QNNExecutionProvider"


@dataclass(frozen=True)
class NodePlacement:
    """Which execution provider a node of the (optimised) graph was assigned to."""

    node: str
    op_type: str
    ep: str

    @property
    def on_htp(self) -> bool:
        """True when the QNN EP (HTP) runs this node."""
        return self.ep == HTP_EP


X86_64_MACHINES = frozenset({"x86_64", "amd64", "x64"})
ARM64_MACHINES = frozenset({"aarch64", "arm64", "aarch64_be", "armv8l", "armv8b"})


def latency_source(runtime: str, machine: str | None) -> str:
    """Return where the timings of a run on runtime ('htp' or 'cpu') on machine came from.

    machine is platform.machine() (or `uname -m`) of the machine the runner ran on:

    * 'simulator': the `htp` runtime on x86-64 (x86_64/AMD64). The QNN HTP backend there is
      Qualcomm's Hexagon HTP simulator: real HTP numerics, but simulator wall time, not a phone's
      latency. This holds for the emulator, for an SSH "board" that is an x86-64 host and for the
      emulated adb phone alike.
    * 'device': the `htp` runtime on aarch64/ARM64, i.e. the SoC's own HTP.
    * 'host-cpu': the `cpu` runtime on x86-64 (an x86-64 machine's CPU, not a Snapdragon's).
    * 'device-cpu': the `cpu` runtime on aarch64/ARM64 (the device's Arm CPU cores).
    * 'unknown': the machine was not reported (an older runner) or is another architecture.
    """
    arch = (machine or "").strip().lower()
    on_x86, on_arm = arch in X86_64_MACHINES, arch in ARM64_MACHINES
    if not (on_x86 or on_arm):
        return "unknown"
    if runtime == "htp":
        return "simulator" if on_x86 else "device"
    return "host-cpu" if on_x86 else "device-cpu"


@dataclass
class RunResult:
    """Outputs of a runner invocation, one dict per input line, plus its report."""

    outputs: list[Feed]
    runtime: str
    load_s: float
    inference_s: list[float]
    placement: list[NodePlacement]
    report: dict = field(repr=False)
    workdir: Path | None = None
    iteration_s: list[float] = field(default_factory=list)  # the measurement loop's iterations
    measured_s: float = 0.0  # wall time of the measurement loop
    peak_rss_mb: float | None = None  # the runner process's peak resident memory
    machine: str | None = None  # platform.machine() where the runner ran (x86_64, aarch64, AMD64, ARM64)
    system: str | None = None  # platform.system() there (Linux, Windows)
    runner: str = "python"  # 'python' (device_runner.py) or 'qnn-net-run'
    notes: list[str] = field(default_factory=list)  # what the runner could not report, e.g. no timings
    # an emulated device's modelled time of each iteration_s iteration (harness.emulator.device_time), None on a
    # real device: the `emulated` latency figure; iteration_s there is the HTP simulator's wall time
    emulated_s: list[float] | None = None
    # the runner process's CPU seconds per inference (all its threads; empty from an older runner or qnn-net-run):
    # on the HTP simulator the simulator's cost, which a busy host does not inflate as it does inference_s
    inference_cpu_s: list[float] = field(default_factory=list)

    @property
    def latency_source(self) -> str:
        """Where this run's timings come from: 'simulator', 'device', 'host-cpu', 'device-cpu' or
        'unknown' (see latency_source())."""
        return latency_source(self.runtime, self.machine)


def remote_model_path(model: Path) -> str:
    """Return where push_model puts model on the device, relative to the work directory (keyed by content)."""
    return f"models/{model_digest(Path(model))[:16]}/{Path(model).name}"


def input_paths(feeds: list[Feed]) -> list[list[tuple[str, str]]]:
    """Return, per feed, the (input name, raw file path relative to the data directory) pairs."""
    return [[(name, f"inputs/{i}/{_safe(name)}.raw") for name in feed] for i, feed in enumerate(feeds)]


FLOAT32_EXACT_INT = 2 ** 24  # every integer of magnitude up to this is exact in float32


def write_input_list(feeds: list[Feed], directory: Path) -> Path:
    """Write feeds as raw float32 files plus a qnn-net-run input list; return the list's path. Integer and bool
    inputs travel as float32 too (the runner casts them back to the model's type): exact for token ids, masks and
    any integer up to 2^24; raises ConfigError naming the input for a larger one, which float32 would round."""
    lines = []
    for k, (feed, items) in enumerate(zip(feeds, input_paths(feeds))):
        for name, rel in items:
            value = np.asarray(feed[name])
            if value.dtype.kind in "iu" and value.size and int(np.abs(value).max()) > FLOAT32_EXACT_INT:
                raise ConfigError(f"input '{name}' (sample {k}, {value.dtype}) holds {int(np.abs(value).max())}: "
                                  f"inputs travel to the device runner as float32 (qnn-net-run's raw layout), exact "
                                  f"only up to 2^24 = {FLOAT32_EXACT_INT}; use smaller ids or offsets")
            (directory / rel).parent.mkdir(parents=True, exist_ok=True)
            np.ascontiguousarray(feed[name], dtype=np.float32).tofile(directory / rel)
        lines.append(" ".join(f"{name}:={rel}" for name, rel in items))
    path = directory / "input_list.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name) or "input"


def push_model(transport: Transport, model: Path) -> str:
    """Push a model (and its external-data or context-binary siblings); return its remote path."""
    model = Path(model)
    remote = remote_model_path(model)
    remote_dir = posixpath.dirname(remote)
    transport.push(model, remote)
    for sibling in model.parent.glob(model.stem + "*"):
        if sibling != model and sibling.suffix == ".bin":
            transport.push(sibling, f"{remote_dir}/{sibling.name}")
    for data in external_data_files(model):
        transport.push(data, f"{remote_dir}/{data.name}")
    if (model.parent / CONTEXT_SIDECAR).is_file():
        transport.push(model.parent / CONTEXT_SIDECAR, f"{remote_dir}/{CONTEXT_SIDECAR}")
    return f"{remote_dir}/{model.name}"


def push_feeds(transport: Transport, feeds: list[Feed], staging: Path) -> str:
    """Stage feeds as raw files + input list on the device once per content; return the list's path.

    The data directory is keyed by the feeds' digest and completed by a marker file pushed
    last, so a re-run (or another step on the same data) transfers nothing.
    """
    remote = f"data/{feeds_digest(feeds)}"
    if not transport.exists(f"{remote}/.complete"):
        write_input_list(feeds, staging)
        transport.push(staging, remote)
        (staging / ".complete").write_text("ok\n")
        transport.push(staging / ".complete", f"{remote}/.complete")
    return f"{remote}/input_list.txt"


def keep_outputs(out_dir: Path, keep_dir: Path | None) -> None:
    """Copy the run's report and QNN profile CSV (where present) into keep_dir."""
    if keep_dir is None:
        return
    keep_dir.mkdir(parents=True, exist_ok=True)
    for name in ("runner_report.json", "qnn_profile.csv"):
        if (out_dir / name).exists():
            shutil.copyfile(out_dir / name, keep_dir / name)
