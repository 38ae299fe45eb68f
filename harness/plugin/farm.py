"""pytest options and hooks of a labgrid farm (harness/farm/labgrid_farm.py): `--farm labgrid://HOST:PORT` (or the
devices file's `farm:`, or $LG_COORDINATOR) makes the coordinator's places the devices. The controller leases them
before collection; pytest-xdist workers get the leased devices from it and share its quarantine on the coordinator;
the places are released when the run ends."""

from __future__ import annotations

import os
from typing import Any

import pytest

from harness.options import positive_seconds

FARM_DEVICES_KEY = "harness_farm_devices"
RUN_KEY = "harness_run_id"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("snapdragon")
    group.addoption("--farm", default=None, metavar="URL",
                    help="labgrid://HOST[:PORT]: the devices are the places of that labgrid coordinator, leased for "
                         "the run (default: the devices file's farm.coordinator, else $LG_COORDINATOR; `none`: the "
                         "devices file's own devices). --device then takes a place, a SoC or tags k=v[,k=v]")
    group.addoption("--lease-ttl", type=positive_seconds, default=None, metavar="SECONDS",
                    help="a labgrid lease not renewed for this long (its run died) is taken over by a waiting run "
                         "(default: the devices file's farm.lease_ttl_s, else 30)")


def farm_settings(config: pytest.Config, devices: Any) -> Any:
    """Return the FarmSettings of this run's labgrid coordinator, or None for a farm without one."""
    from harness.devices import FarmSettings

    url = config.option.farm or (devices.farm.coordinator if devices.farm else None) or os.environ.get("LG_COORDINATOR")
    if not url or url == "none":
        return None
    base = devices.farm or FarmSettings(coordinator=url)
    update: dict[str, Any] = {"coordinator": url}
    if config.option.lease_ttl is not None:
        update["lease_ttl_s"] = config.option.lease_ttl
    return base.model_copy(update=update)


def run_of(config: pytest.Config) -> str:
    """Return the run's id: the controller's (harness.farm.identity.run_id), handed to its xdist workers."""
    from harness.farm.identity import run_id

    workerinput = getattr(config, "workerinput", None)
    return workerinput[RUN_KEY] if workerinput is not None and RUN_KEY in workerinput else run_id()


def open_farm(config: pytest.Config, devices: Any, settings: Any, selectors: list[str],
              timeout_s: float, run: str) -> tuple[list[Any], Any, list[str]]:
    """Return the devices leased for selectors, the LabgridFarm (the run's quarantine store) and the places
    --unquarantine released; an xdist worker takes the devices its controller leased."""
    from pydantic import TypeAdapter

    from harness.devices import DeviceSpec
    from harness.farm.labgrid_farm import LabgridFarm
    from harness.plugin.devices import live_line

    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and FARM_DEVICES_KEY in workerinput:
        farm = LabgridFarm(settings, devices, quarantine_hours=config.option.quarantine_hours, run=run)
        adapter = TypeAdapter(DeviceSpec)
        return [adapter.validate_python(d) for d in workerinput[FARM_DEVICES_KEY]], farm, []
    farm = LabgridFarm(settings, devices, quarantine_hours=config.option.quarantine_hours, run=run,
                       progress=lambda line: live_line(config)(f"harness: {line}"))
    try:
        released = farm.release(config.option.unquarantine)
    except BaseException:
        farm.close()
        raise
    workers = getattr(config.option, "numprocesses", None)
    leased = farm.lease(selectors, per_filter=max(1, int(workers or 1)), timeout_s=timeout_s)
    return leased, farm, released


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Hand an xdist worker the run's id, and the devices its controller leased from a labgrid farm (workers never
    lease)."""
    from harness.farm.labgrid_farm import LabgridFarm
    from harness.plugin import SESSION_KEY

    session = node.config.stash.get(SESSION_KEY, None)
    farm = getattr(getattr(session, "pool", None), "farm", None)
    node.workerinput[RUN_KEY] = run_of(node.config)
    if isinstance(farm, LabgridFarm):
        node.workerinput[RUN_KEY] = farm.run
        node.workerinput[FARM_DEVICES_KEY] = list({t.device.id: t.device.model_dump() for t in session.targets}.values())


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Name the coordinator, the run and the places it leased."""
    from harness.farm.labgrid_farm import LabgridFarm
    from harness.plugin import SESSION_KEY

    session = config.stash.get(SESSION_KEY, None)
    farm = getattr(getattr(session, "pool", None), "farm", None)
    if isinstance(farm, LabgridFarm) and not hasattr(config, "workerinput"):
        places = sorted({t.device.id for t in session.targets})
        terminalreporter.write_line(f"labgrid coordinator {farm.coordinator.address}: run {farm.run} leased "
                                    f"{', '.join(places) or 'no place'} from {farm.host}")
