"""The device farm: the SoC catalog (shipped as harness/socs.yaml) and the device list, schema-validated.

A devices file holds `devices:` and optionally `socs:`, whose entries add SoCs to the built-in
catalog or override fields of built-in ones (merged key by key, nested mappings too). Without a
devices file, or in one without a `devices:` key, the devices are the built-in emulators, one per SoC.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import ConfigError

BUILTIN_CATALOG = "socs.yaml"  # package data of `harness`
BUILTIN_DEVICES = "built-in emulator devices"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SocThermal(_Strict):
    """Parameters of the emulator's thermal and power model of a SoC (a model, not measurements).

    See harness/emulator/thermal.py: power from the device runner's NPU busy fraction drives two
    first-order RC nodes (die, skin); the emulated HTP throttles above a trip point with hysteresis;
    Android's thermal status comes from the hottest zone.
    """

    ambient_c: float = 25.0
    idle_power_w: float = Field(1.0, ge=0, description="SoC power with the NPU idle, W")
    load_power_w: float = Field(6.6, ge=0, description="SoC power with the NPU fully busy at full clocks, W")
    r_die_c_per_w: float = Field(12.0, gt=0, description="die-to-ambient thermal resistance, °C/W")
    c_die_j_per_c: float = Field(1.5, gt=0, description="die heat capacity, J/°C")
    r_skin_c_per_w: float = Field(4.0, gt=0)
    c_skin_j_per_c: float = Field(45.0, gt=0)
    battery_voltage_v: float = Field(3.87, gt=0)
    throttle_trip_c: float = Field(95.0, description="NPU zone temperature at which the emulated HTP throttles, °C")
    throttle_clear_c: float = Field(85.0, description="throttling stops below this NPU zone temperature, °C")
    throttle_factor: float = Field(2.0, ge=1, description="NPU work takes this many times longer while throttled")
    status_light_margin_c: float = Field(5.0, ge=0, description="status LIGHT from this far below the trip, °C")
    status_severe_c: float = Field(100.0, description="thermal status SEVERE from this hottest-zone temperature, °C")
    status_critical_c: float = Field(110.0, description="thermal status CRITICAL from, °C")
    status_emergency_c: float = Field(112.0, description="thermal status EMERGENCY from, °C")
    status_shutdown_c: float = Field(115.0, description="thermal status SHUTDOWN from (also the critical trip), °C")

    @model_validator(mode="after")
    def _check_thresholds(self) -> "SocThermal":
        if not self.throttle_clear_c < self.throttle_trip_c:
            raise ValueError(f"thermal: throttle_clear_c ({self.throttle_clear_c:g}) must be below "
                             f"throttle_trip_c ({self.throttle_trip_c:g})")
        ladder = [self.status_severe_c, self.status_critical_c, self.status_emergency_c, self.status_shutdown_c]
        if ladder != sorted(ladder):
            raise ValueError("thermal: status thresholds must rise: status_severe_c <= status_critical_c <= "
                             "status_emergency_c <= status_shutdown_c")
        return self


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
    llm_memory_mb: float | None = Field(None, gt=0, description="memory an LLM's weights, KV cache and activations "
                                        "may take on the HTP, MiB (for the LLM memory estimate)")
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


class FarmSettings(_Strict):
    """A labgrid coordinator whose places are the devices (harness/farm/labgrid_farm.py), and what the places'
    SSH boards need from this host."""

    coordinator: str = Field(description="labgrid://HOST[:PORT] (labgrid's default port is 20408)")
    ssh_key_file: str = "~/.ssh/id_ed25519"
    known_hosts: str = "~/.ssh/known_hosts"
    lease_ttl_s: float = Field(30.0, ge=2, description="a lease not renewed for this long is taken over, s")


class DevicesFile(_Strict):
    """A parsed devices file: the merged SoC catalog and the devices (path: where they came from)."""

    socs: dict[str, SocSpec]
    devices: list[DeviceSpec] = []
    farm: FarmSettings | None = None
    path: str = ""

    @model_validator(mode="after")
    def _check_references(self) -> "DevicesFile":
        seen: set[str] = set()
        for index, dev in enumerate(self.devices):
            if dev.soc not in self.socs:
                raise ValueError(f"devices[{index}] ({dev.id}): unknown SoC '{dev.soc}': not in the built-in "
                                 f"catalog nor in this file's socs: (known SoCs: {', '.join(sorted(self.socs))}; "
                                 "add it under socs: with name, soc_model, htp_arch, vtcm_mb, board_platform)")
            if dev.id in seen:
                raise ValueError(f"devices[{index}]: duplicate device id '{dev.id}'")
            seen.add(dev.id)
        return self

    def soc(self, soc_id: str) -> SocSpec:
        """Return the catalog entry for soc_id, with its id filled in."""
        return self.socs[soc_id].model_copy(update={"id": soc_id})

    def select(self, selectors: list[str]) -> list[DeviceSpec]:
        """Return the devices named by ids or SoC ids (`all`: every device of the file), in the order given,
        without repeats.

        Raises ConfigError listing the known ids and SoCs for a selector that matches nothing.
        """
        chosen: list[DeviceSpec] = []
        for sel in selectors:
            matched = [d for d in self.devices if d.id == sel] or [d for d in self.devices if d.soc == sel]
            if not matched and sel == "all":
                matched = list(self.devices)
            if not matched:
                hint = ""
                if sel in self.socs:
                    hint = f" ('{sel}' is a catalog SoC, but no device of it is listed)"
                elif self.path == BUILTIN_DEVICES:
                    hint = " (no devices file: pass --devices-file or set $HARNESS_DEVICES_FILE for real devices)"
                raise ConfigError(
                    f"unknown device '{sel}' in {self.path}: known device ids: "
                    f"{', '.join(d.id for d in self.devices) or '(none)'}; "
                    f"known SoCs: {', '.join(sorted({d.soc for d in self.devices})) or '(none)'}{hint}")
            chosen.extend(d for d in matched if d not in chosen)
        return chosen


def _format_validation_error(path: Path | str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("function-after", "tagged-union")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; allowed keys are listed in devices.yaml's header)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "value_error" and not loc:  # our own cross-checks name their key themselves
            lines.append(f"  {e['ctx']['error']}")
            continue
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return f"{path}: invalid devices file:\n" + "\n".join(lines)


def _read_yaml_mapping(p: Path | str, text: str, expected: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with keys {expected}, got {type(data).__name__}")
    return data


def _merge(base: Any, override: Any) -> Any:
    """Return base with override's keys laid over it, recursively for mappings."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in override.items()}}
    return override


def builtin_catalog_data() -> dict[str, Any]:
    """Return the raw `socs:` mapping of the catalog that ships with the package (harness/socs.yaml)."""
    ref = resources.files("harness").joinpath(BUILTIN_CATALOG)
    data = _read_yaml_mapping(f"harness/{BUILTIN_CATALOG}", ref.read_text(encoding="utf-8"), "'socs'")
    return data.get("socs") or {}


def _emulators_for(socs: dict[str, Any]) -> list[dict[str, str]]:
    return [{"id": f"{soc}-emu", "soc": soc, "transport": "emulator"} for soc in socs]


def _validate(data: dict[str, Any], where: str) -> DevicesFile:
    try:
        return DevicesFile.model_validate({**data, "path": where})
    except ValidationError as e:
        raise ConfigError(_format_validation_error(where, e)) from None


def builtin_devices() -> DevicesFile:
    """Return the built-in catalog with one emulator device per SoC (`sm8650-emu`, ...): no file needed."""
    socs = builtin_catalog_data()
    return _validate({"socs": socs, "devices": _emulators_for(socs)}, BUILTIN_DEVICES)


def load_devices_file(path: str | os.PathLike[str] | None = None) -> DevicesFile:
    """Return the parsed and validated devices file, its `socs:` merged over the built-in catalog.

    Without a path: $HARNESS_DEVICES_FILE, else the built-in emulator devices (one per SoC). A file
    without a `devices:` key gets the built-in emulators of its merged catalog.
    Raises ConfigError naming the file, the key and what was expected.
    """
    chosen = path or os.environ.get("HARNESS_DEVICES_FILE")
    if not chosen:
        return builtin_devices()
    p = Path(chosen).expanduser()
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read devices file {p}: {e.strerror}") from None
    data = _read_yaml_mapping(p, text, "'devices' and (optional) 'socs'")
    user_socs = data.get("socs") or {}
    if not isinstance(user_socs, dict):
        raise ConfigError(f"{p}: socs: expected a mapping of SoC id to fields, got {type(user_socs).__name__}")
    socs = _merge(builtin_catalog_data(), user_socs)
    devices = data["devices"] if "devices" in data else _emulators_for(socs)
    return _validate({**data, "socs": socs, "devices": devices}, str(p))


def load_catalog(path: str | os.PathLike[str] | None = None) -> DevicesFile:
    """Return the devices file (default: the built-in devices), for callers that only need its SoC catalog."""
    return load_devices_file(path)
