"""SoC detection: what a device says it is, checked against its devices.yaml entry on connect.

* Android (adb): ``getprop ro.soc.model`` (Android 12+, e.g. "SM8650"), else ``ro.board.platform``
  (e.g. "pineapple"), compared with the catalog's board_platform.
* Linux boards (ssh): ``/sys/devices/soc0/machine`` (e.g. "QCS6490"; ``soc_id`` and ``family`` are
  reported alongside), else the ``qcom,<part>`` entries of ``/proc/device-tree/compatible``.
* The local emulator reports the SoC it emulates.

A reported SoC that differs from the entry stops with SocMismatchError ("device X reports SM8550,
devices.yaml says sm8650"). A device that reports nothing recognisable (an x86 test host, a board
without socinfo) gives a SocDetectionWarning and goes on; ``soc_detect: require`` makes that an
error, ``soc_detect: off`` skips detection.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.errors import SocMismatchError, TransportError

if TYPE_CHECKING:
    from harness.devices import SocSpec
    from harness.transports.base import Transport

ANDROID_PROPS = ("ro.soc.model", "ro.board.platform", "ro.soc.manufacturer", "ro.hardware")
LINUX_SOC_FILES = ("/sys/devices/soc0/machine", "/sys/devices/soc0/soc_id", "/sys/devices/soc0/family")
LINUX_DT_COMPATIBLE = "/proc/device-tree/compatible"
DETECT_TIMEOUT_S = 20.0

_READ_FILES = ('for f in "$@"; do if [ -r "$f" ]; then printf "%s=" "$f"; '
               'tr "\\000\\n" "  " < "$f"; echo; fi; done')


class SocDetectionWarning(UserWarning):
    """A device did not say which SoC it has; the devices.yaml entry is trusted."""


@dataclass(frozen=True)
class SocReport:
    """What a device said about its SoC."""

    source: str  # "getprop", "soc0", "device-tree", "emulator" or "none"
    reported: str  # the strongest value, e.g. "SM8550" or "pineapple"; "" when nothing was reported
    values: dict[str, str] = field(default_factory=dict)


def read_report(transport: "Transport") -> SocReport:
    """Return what the device behind transport says it is (one remote command)."""
    if transport.device.transport == "emulator":
        return SocReport("emulator", transport.soc.id.upper(), {"emulated": transport.soc.id})
    if transport.platform == "android":
        script = "; ".join(f"printf '%s=%s\\n' {p} \"$(getprop {p})\"" for p in ANDROID_PROPS)
        result = transport.read_command(["sh", "-c", script], timeout_s=DETECT_TIMEOUT_S)
        return android_report(_key_values(result.stdout))
    files = (*LINUX_SOC_FILES, LINUX_DT_COMPATIBLE)
    result = transport.read_command(["sh", "-c", _READ_FILES, "sh", *files], timeout_s=DETECT_TIMEOUT_S)
    raw = _key_values(result.stdout)
    return linux_report({name: raw.get(path, "") for name, path in
                         zip(("machine", "soc_id", "family", "compatible"), files)})


def android_report(props: dict[str, str]) -> SocReport:
    """Return the report for Android system properties."""
    model = props.get("ro.soc.model", "").strip()
    if model:
        return SocReport("getprop", model, props)
    platform = props.get("ro.board.platform", "").strip()
    return SocReport("getprop" if platform else "none", platform, props)


def linux_report(values: dict[str, str]) -> SocReport:
    """Return the report for soc0 `machine`/`soc_id`/`family` and the device-tree `compatible` list."""
    machine = values.get("machine", "").strip()
    if machine:
        return SocReport("soc0", machine, values)
    parts = qcom_parts(values.get("compatible", ""))
    socs = [p for p in parts if "-" not in p] or parts  # "qcs6490-rb3gen2" names a board, "qcm6490" a SoC
    return SocReport("device-tree" if parts else "none", socs[0] if socs else "", values)


def qcom_parts(compatible: str) -> list[str]:
    """Return the part names of `qcom,<part>[-board]` entries, most specific last as listed."""
    parts = []
    for entry in compatible.replace("\0", " ").split():
        vendor, _, name = entry.partition(",")
        if vendor == "qcom" and name:
            parts.append(name)
    return parts


def matches(report: SocReport, soc: "SocSpec") -> bool:
    """Return whether report names the SoC of the devices.yaml entry (by id or board platform)."""
    accepted = {soc.id.lower(), soc.board_platform.lower()}
    if report.source == "device-tree":
        names = qcom_parts(report.values.get("compatible", "")) or [report.reported]
        return any(n.lower() in accepted or n.lower().split("-")[0] in accepted for n in names)
    return report.reported.strip().lower() in accepted


def verify_soc(transport: "Transport") -> SocReport:
    """Check the device's reported SoC against its entry; return the report.

    Raises SocMismatchError on a mismatch (and, with soc_detect: require, when nothing is
    reported); warns with SocDetectionWarning when nothing is reported.
    """
    device = transport.device
    mode = getattr(device, "soc_detect", "auto")
    if mode == "off":
        return SocReport("none", "", {"soc_detect": "off"})
    try:
        report = read_report(transport)
    except TransportError as e:
        raise TransportError(f"cannot read the SoC of device {device.id}: {e}", device=device.id) from e
    if report.source == "none":
        message = (f"device {device.id} does not report its SoC ({_where(transport)}); trusting devices.yaml "
                   f"(soc: {device.soc}). Set `soc_detect: off` on the entry to silence this")
        if mode == "require":
            raise SocMismatchError(message.replace("trusting devices.yaml", "and its entry has soc_detect: require"))
        warnings.warn(SocDetectionWarning(message), stacklevel=2)
        return report
    if not matches(report, transport.soc):
        raise SocMismatchError(
            f"device {device.id} reports {report.reported} ({report.source}), devices.yaml says {device.soc}: "
            f"fix the entry's `soc:` (or the serial/host, if this is the wrong device)")
    return report


def _where(transport: "Transport") -> str:
    if transport.platform == "android":
        return "getprop ro.soc.model and ro.board.platform are empty"
    return "no /sys/devices/soc0/machine and no qcom entry in /proc/device-tree/compatible"


def _key_values(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value.strip()
    return values
