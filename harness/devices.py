"""The device farm: SoC catalog and device list from devices.yaml, schema-validated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import ConfigError

DEFAULT_DEVICES_FILE = Path(__file__).resolve().parent.parent / "devices.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SocThermal(_Strict):
    """Parameters of the emulator's thermal and power model of a SoC (a model, not measurements).

    See harness/emulator/thermal.py: idle/load power drive two first-order RC nodes (die, skin).
    """

    ambient_c: float = 25.0
    idle_power_w: float = Field(0.9, ge=0)
    load_power_w: float = Field(5.0, ge=0)
    r_die_c_per_w: float = Field(9.0, gt=0, description="die-to-ambient thermal resistance, °C/W")
    c_die_j_per_c: float = Field(2.2, gt=0, description="die heat capacity, J/°C")
    r_skin_c_per_w: float = Field(5.0, gt=0)
    c_skin_j_per_c: float = Field(36.0, gt=0)
    battery_voltage_v: float = Field(3.87, gt=0)


class SocSpec(_Strict):
    """One Snapdragon part: what the QNN HTP backend needs to target it."""

    name: str
    soc_model: int = Field(gt=0, description="QNN SoC id (QnnTypes.h)")
    htp_arch: int = Field(ge=68, description="Hexagon HTP version, e.g. 75 for v75")
    vtcm_mb: float = Field(gt=0)
    board_platform: str
    int8_tops: float | None = Field(None, gt=0, description="NPU peak INT8 throughput, TOPS (for the latency estimate)")
    ddr_bandwidth_gbps: float | None = Field(None, gt=0, description="peak DRAM bandwidth, GB/s (for the estimate)")
    perf_source: str | None = Field(None, description="where int8_tops/ddr_bandwidth_gbps come from; which are estimates")
    thermal: SocThermal | None = Field(None, description="emulator thermal/power model parameters (not measurements)")
    id: str = ""

    @property
    def vtcm_bytes(self) -> int:
        """VTCM size in bytes."""
        return int(self.vtcm_mb * 1024 * 1024)


class TelemetrySettings(_Strict):
    """Where a device exposes temperatures and power (device paths), and whether to sample them.

    thermal_dir holds thermal_zone*/type and temp (millidegrees C); power_supply holds current_now
    (µA) and voltage_now (µV). power_supply defaults to /sys/class/power_supply/battery on Android
    devices (adb, emulator) and to none on Linux boards (ssh), which are usually mains-powered.
    """

    enabled: bool = True
    thermal_dir: str = "/sys/class/thermal"
    power_supply: str | None = None
    power: bool = Field(True, description="false: do not read power even where a default path exists")


class _DeviceBase(_Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    soc: str
    telemetry: TelemetrySettings = TelemetrySettings()


class EmulatorDevice(_DeviceBase):
    """A local sandbox directory standing for the device's filesystem; the runner runs on the host."""

    transport: Literal["emulator"]
    sandbox: str | None = None


class AdbDevice(_DeviceBase):
    """An Android device reached through the adb server."""

    transport: Literal["adb"]
    serial: str
    adb_host: str = "127.0.0.1"
    adb_port: int | None = Field(None, description="adb server port (default: $ANDROID_ADB_SERVER_PORT or 5037)")
    workdir: str = Field("/data/local/tmp/harness", pattern=r"^/data/local/tmp/[^/].*")
    python: str | None = None
    qairt_sdk: str | None = None
    soc_detect: Literal["auto", "require", "off"] = "auto"


class SshDevice(_DeviceBase):
    """A Linux Snapdragon board reached over SSH."""

    transport: Literal["ssh"]
    host: str
    port: int = 22
    user: str
    key_file: str
    known_hosts: str = "~/.ssh/known_hosts"
    trust_on_first_use: bool = False
    python: str = "python3"
    workdir: str = "/tmp/harness"
    soc_detect: Literal["auto", "require", "off"] = Field(
        "auto", description="auto: a reported SoC must match, an unreported one warns; require: must report; off")


DeviceSpec = Annotated[Union[EmulatorDevice, AdbDevice, SshDevice], Field(discriminator="transport")]


class DevicesFile(_Strict):
    """The parsed devices.yaml."""

    socs: dict[str, SocSpec]
    devices: list[DeviceSpec] = []
    path: str = ""

    @model_validator(mode="after")
    def _check_references(self) -> "DevicesFile":
        seen: set[str] = set()
        for index, dev in enumerate(self.devices):
            if dev.soc not in self.socs:
                raise ValueError(f"devices[{index}] ({dev.id}): soc '{dev.soc}' is not in socs "
                                 f"(known: {', '.join(sorted(self.socs))})")
            if dev.id in seen:
                raise ValueError(f"devices[{index}]: duplicate device id '{dev.id}'")
            seen.add(dev.id)
        return self

    def soc(self, soc_id: str) -> SocSpec:
        """Return the catalog entry for soc_id, with its id filled in."""
        return self.socs[soc_id].model_copy(update={"id": soc_id})

    def select(self, selectors: list[str]) -> list[DeviceSpec]:
        """Return the devices named by ids or SoC ids, in the order given, without repeats.

        Raises ConfigError listing the known ids and SoCs for a selector that matches nothing.
        """
        chosen: list[DeviceSpec] = []
        for sel in selectors:
            matched = [d for d in self.devices if d.id == sel] or [d for d in self.devices if d.soc == sel]
            if not matched:
                raise ConfigError(
                    f"unknown device '{sel}' in {self.path}: known device ids: "
                    f"{', '.join(d.id for d in self.devices) or '(none)'}; "
                    f"known SoCs: {', '.join(sorted({d.soc for d in self.devices})) or '(none)'}")
            chosen.extend(d for d in matched if d not in chosen)
        return chosen


def _format_validation_error(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-after", "tagged-union")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; allowed keys are listed in devices.yaml's header)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return f"{path}: invalid devices file:\n" + "\n".join(lines)


def load_devices_file(path: str | os.PathLike[str] | None = None) -> DevicesFile:
    """Return the parsed and validated devices file (default: the repository's devices.yaml).

    Raises ConfigError naming the file, the key and what was expected.
    """
    p = Path(path or os.environ.get("HARNESS_DEVICES_FILE") or DEFAULT_DEVICES_FILE).expanduser()
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read devices file {p}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with keys 'socs' and 'devices', got {type(data).__name__}")
    try:
        return DevicesFile.model_validate({**data, "path": str(p)})
    except ValidationError as e:
        raise ConfigError(_format_validation_error(p, e)) from None


def load_catalog(path: str | os.PathLike[str] | None = None) -> DevicesFile:
    """Return the devices file, for callers that only need its SoC catalog."""
    return load_devices_file(path)
