"""Transports: how the harness reaches a device's filesystem and runs commands on it, and open_transport, the
factory that picks one by the device entry's kind (transports.base is their interface and imports none of them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.soc_detect import verify_soc
from harness.transports.base import CommandResult, PushResult, Transport
from harness.transports.emulator import EmulatorTransport

if TYPE_CHECKING:
    from harness.devices import DeviceSpec, SocSpec

__all__ = ["CommandResult", "PushResult", "Transport", "open_transport"]


def open_transport(device: "DeviceSpec", soc: "SocSpec", sandbox_root: Path, *, detect_soc: bool = True) -> Transport:
    """Return a connected transport for a device entry, its SoC checked against what the device reports.

    Raises SocMismatchError when the device reports another SoC than devices.yaml says, ConfigError
    for an unusable entry, TransportError (HostKeyError, DeviceLostError) when it cannot be reached.
    """
    if device.transport == "emulator":
        transport: Transport = EmulatorTransport(device, soc, sandbox_root)
    elif device.transport == "ssh":
        from harness.transports.ssh import SshTransport  # paramiko: loaded for SSH devices only

        transport = SshTransport(device, soc)
    elif device.transport == "adb":
        from harness.transports.adb import AdbTransport  # adbutils: loaded for adb devices only

        transport = AdbTransport(device, soc)
    else:
        raise ConfigError(f"device '{device.id}': transport '{device.transport}' is not available in this version")
    if detect_soc:
        try:
            verify_soc(transport)
        except BaseException:
            transport.close()
            raise
    return transport
