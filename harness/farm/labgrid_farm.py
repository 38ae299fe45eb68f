"""A device farm run by a labgrid coordinator: its places are the harness's devices, leased through the coordinator's
reservations, and its quarantine lives on the places, where every orchestrator on every host sees it.

* **Places as devices.** A place tagged `soc=<SoC id>` is a device whose id is the place's name. Its transport is
  its `transport` tag (ssh|adb), else the resource it matches: a `NetworkService` (address, port, username) is an
  SSH board; an `AdbDevice` (serial, address and port of the adb server on the exporter's host) is a phone. Tags
  `python`, `workdir`, `qairt_sdk`, `soc_detect` set the device's fields of those names; the SSH key and known_hosts
  file come from the devices file's `farm:` section (host keys are verified as for any SSH device).
* **Leases.** `--device sm8650` (a SoC), `--device soc=sm8650,transport=ssh` (a tag filter) or `--device PLACE` asks
  the coordinator for reservations (labgrid's scheduler serves them by priority, then age: first come, first served),
  waits for them with a line every WAIT_LINE_S naming who holds the matching places, and acquires what it is
  allocated. While the session holds a place it renews the place's `lease_until` tag every lease_ttl_s / 4; at the
  end (and on Ctrl-C or SIGTERM) it releases the place and cancels its reservation. An orchestrator that dies
  (SIGKILL, a lost host) stops renewing: once `lease_until` has passed, the next orchestrator waiting for that place
  releases it and cancels the dead one's reservation (labgrid-client's `release --kick`, done by the harness), so a
  dead orchestrator's place is blocked for at most lease_ttl_s plus one poll (POLL_S). A place acquired outside the
  harness (no `lease_until` tag) is never taken over.
* **Quarantine.** A place quarantined by any orchestrator (failed health check, lost mid-run, transport errors) keeps
  being acquired by it after its run, with tags `quarantine_until`, `quarantine_since`, `quarantine_by` and the
  reason as the place's comment: no reservation is allocated it, every orchestrator reports it, and `--unquarantine
  PLACE` from any host clears it and releases the place. It ends by itself when `quarantine_until` passes.

`$HARNESS_LOCK_LOG` (a file path, as for the host-wide locks of harness/farm/locks.py): every lease appends one JSON
line when it ends (device, host, pid, run, asked_at, acquired_at, released_at: epoch seconds; release_s).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from typing import Callable

from pydantic import ValidationError

from harness.devices import AdbDevice, DevicesFile, DeviceSpec, FarmSettings, SshDevice
from harness.errors import FarmError
from harness.farm.labgrid_client import ACQUIRED, ALLOCATED, EXPIRED, INVALID, WAITING, Coordinator, PlaceView
from harness.farm.identity import run_id
from harness.farm.state import DEFAULT_QUARANTINE_HOURS, Quarantine

POLL_S = 1.0
WAIT_LINE_S = 30.0
FIRST_WAIT_LINE_S = 2.0
SETTLE_S = 3.0  # after the first place of several is acquired, how long the others may take
DEVICE_TAGS = ("python", "workdir", "qairt_sdk", "soc_detect")
LEASE_TAGS = ("lease_until", "lease_since", "lease_host", "lease_pid", "lease_run")
QUARANTINE_TAGS = ("quarantine_until", "quarantine_since", "quarantine_by")
QUARANTINE_COMMENT = "quarantined by the harness: "


def parse_filter(text: str) -> dict[str, str]:
    """Return the tags of a filter `k=v,k2=v2`; FarmError for a malformed one."""
    tags = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise FarmError(f"--device {text!r}: expected a place name, a SoC id or tags key=value[,key=value...]")
        tags[key.strip()] = value.strip()
    return tags


def _filter_text(tags: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in tags.items())


def _matches(place: PlaceView, tags: dict[str, str]) -> bool:
    have = {**place.tags, "name": place.name}
    return all(have.get(k) == v for k, v in tags.items())


def _epoch(place: PlaceView, tag: str) -> float | None:
    try:
        return float(place.tags[tag])
    except (KeyError, ValueError):
        return None


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc).isoformat()


def active_quarantine(place: PlaceView, now: float | None = None) -> Quarantine | None:
    """Return the place's quarantine while it lasts (None when it has none or it has expired)."""
    until = _epoch(place, "quarantine_until")
    if until is None or until <= (now or time.time()):
        return None
    reason = place.comment.removeprefix(QUARANTINE_COMMENT) or "quarantined"
    by = place.tags.get("quarantine_by")
    return Quarantine(place.name, reason + (f" (by {by})" if by else ""),
                      _iso(_epoch(place, "quarantine_since") or until), _iso(until))


def holder_text(place: PlaceView, now: float | None = None) -> str:
    """Return who holds a place and since when, as a waiting run or an error names it."""
    now = now or time.time()
    quarantine = active_quarantine(place, now)
    if quarantine is not None:
        return f"{place.name} quarantined: {quarantine}"
    if place.acquired is None:
        return f"{place.name} reserved for another run" if place.reservation else f"{place.name} free"
    since = _epoch(place, "lease_since")
    if since is None:
        return (f"{place.name} held by {place.acquired} outside the harness (no lease; "
                f"`labgrid-client -p {place.name} release --kick` frees it)")
    until = _epoch(place, "lease_until") or 0
    who = f"{place.tags.get('lease_host', place.acquired)} pid {place.tags.get('lease_pid', '?')}"
    stale = f", lease expired {now - until:.0f} s ago" if until < now else ""
    return f"{place.name} held by {who} (run {place.tags.get('lease_run', '?')}) for {now - since:.0f} s{stale}"


def place_device(place: PlaceView, devices: DevicesFile, settings: FarmSettings) -> DeviceSpec:
    """Return the device a place stands for; FarmError naming the place and what it lacks."""
    soc = place.tags.get("soc")
    known = ", ".join(sorted(devices.socs))
    if not soc:
        raise FarmError(f"place {place.name} has no soc tag: set it with `labgrid-client -p {place.name} set-tags "
                        f"soc=<SoC id>` (known SoCs: {known})")
    if soc not in devices.socs:
        raise FarmError(f"place {place.name}: unknown SoC soc={soc} (known SoCs: {known}; add it under socs: in "
                        "the devices file)")
    transport = place.tags.get("transport") or ("adb" if "AdbDevice" in place.resources else "ssh")
    extra = {k: place.tags[k] for k in DEVICE_TAGS if k in place.tags}
    try:
        if transport == "adb":
            adb = place.resources.get("AdbDevice")
            if adb is None or "serial" not in adb:
                raise FarmError(f"place {place.name} (transport=adb) matches no AdbDevice resource with a serial: "
                                "is its exporter running and exporting the phone (README: a farm of two hosts)?")
            return AdbDevice(id=place.name, soc=soc, transport="adb", serial=str(adb["serial"]),
                             adb_host=str(adb.get("address", "127.0.0.1")),
                             adb_port=int(adb["port"]) if adb.get("port") else None, **extra)
        if transport != "ssh":
            raise FarmError(f"place {place.name}: transport={transport} is not one of ssh, adb")
        ssh = place.resources.get("NetworkService")
        if ssh is None:
            raise FarmError(f"place {place.name} (transport=ssh) matches no NetworkService resource: is its exporter "
                            "running?")
        return SshDevice(id=place.name, soc=soc, transport="ssh", host=str(ssh["address"]),
                         port=int(ssh.get("port") or 22), user=str(ssh["username"]), key_file=settings.ssh_key_file,
                         known_hosts=settings.known_hosts, **extra)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise FarmError(f"place {place.name}: its tags or resources do not make a device: {problems}") from None


class LabgridFarm:
    """The session's view of a labgrid farm: the places it leased, their renewal, and the farm's quarantine
    (the quarantine store the device pool writes to, as FarmState for a farm without a coordinator)."""

    def __init__(self, settings: FarmSettings, devices: DevicesFile, *,
                 quarantine_hours: float = DEFAULT_QUARANTINE_HOURS,
                 progress: Callable[[str], None] | None = None, run: str | None = None) -> None:
        self.settings = settings
        self.devices = devices
        self.quarantine_hours = quarantine_hours
        self.progress = progress or (lambda line: None)
        self.coordinator = Coordinator(settings.coordinator)
        self.run = run or run_id()
        self.host = self.coordinator.name.split("/")[0]  # as labgrid names it ($LG_HOSTNAME, else the host name)
        self.held: dict[str, str | None] = {}  # place -> the reservation it was allocated through
        self._times: dict[str, tuple[float, float]] = {}  # place -> (asked_at, acquired_at), for $HARNESS_LOCK_LOG
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # -- leasing --------------------------------------------------------------------------------------------------

    def wanted(self, selector: str, places: dict[str, PlaceView]) -> dict[str, str]:
        """Return the reservation filter a --device selector stands for (a place's name, a SoC id, or tags)."""
        if selector in places:
            return {"name": selector}
        if "=" in selector:
            return parse_filter(selector)
        if selector in self.devices.socs:
            return {"soc": selector}
        raise FarmError(f"--device {selector}: no place of that name at labgrid coordinator "
                        f"{self.coordinator.address}, and it is not a SoC id nor a tag filter (places: "
                        f"{', '.join(sorted(places)) or 'none'})")

    def lease(self, selectors: list[str], per_filter: int, timeout_s: float) -> list[DeviceSpec]:
        """Return the devices of the places leased for selectors (per_filter places for a SoC or tag filter, as
        many as the run's workers can use; one for a place name), waiting up to timeout_s in the coordinator's
        queue. A selector whose matching places are all quarantined gives those places, not leased (the run
        skips them naming why). Raises FarmError naming the filter and the holders."""
        try:
            places = self.coordinator.places()
            chosen: list[DeviceSpec] = []
            for selector in selectors:
                tags = self.wanted(selector, places)
                matching = [p for p in places.values() if _matches(p, tags)]
                if not matching:
                    raise FarmError(f"no place matches {_filter_text(tags)} at labgrid coordinator "
                                    f"{self.coordinator.address} (places: {_places_text(places)})")
                for place in matching:  # a bad place is named before any waiting
                    place_device(place, self.devices, self.settings)
                out = [(p, q) for p in matching if (q := active_quarantine(p)) is not None]
                if len(out) == len(matching):  # nothing else to wait for: the run reports them, skipped (exit 6)
                    chosen += [place_device(p, self.devices, self.settings) for p in matching]
                    continue
                for place, quarantine in out:
                    self.progress(f"{place.name} matches {_filter_text(tags)} but is quarantined: {quarantine}; "
                                  f"`--unquarantine {place.name}` puts it back")
                count = 1 if "name" in tags else per_filter
                leased = self._wait_for(tags, count, timeout_s)
                places = self.coordinator.places()  # once, after the waiting: the leased places as they are now
                chosen += [place_device(places[name], self.devices, self.settings) for name in leased]
            self._start_renewing()
            return chosen
        except BaseException:
            self.close()
            raise

    def _wait_for(self, tags: dict[str, str], count: int, timeout_s: float) -> list[str]:
        """Return the places acquired for `count` reservations of tags (at least one), in the order served."""
        wanted = _filter_text(tags)
        tokens = [self.coordinator.reserve(tags).token for _ in range(count)]
        started, asked_at = time.monotonic(), time.time()
        next_line = started + FIRST_WAIT_LINE_S
        got: list[str] = []
        first_at: float | None = None
        try:
            while True:
                for token in list(tokens):
                    reservation = self.coordinator.poll(token)
                    if reservation.state in (ALLOCATED, ACQUIRED) and reservation.place:
                        self._take(reservation.place, token, asked_at)
                        tokens.remove(token)
                        got.append(reservation.place)
                        first_at = first_at or time.monotonic()
                    elif reservation.state in (EXPIRED, INVALID):  # not polled in time: ask again, at the back
                        tokens[tokens.index(token)] = self.coordinator.reserve(tags).token
                now = time.monotonic()
                if not tokens or (first_at is not None and now - first_at >= SETTLE_S):
                    return got
                places = self.coordinator.places()
                matching = [p for p in places.values() if _matches(p, tags)]
                self._take_over_stale(matching)
                if first_at is None and now - started >= timeout_s:
                    raise FarmError(f"no place matching {wanted} was free within {timeout_s:g} s "
                                    f"(--device-lock-timeout): {'; '.join(holder_text(p) for p in matching)}")
                if first_at is None and now >= next_line:
                    ahead = self._ahead_of(tokens[0])
                    self.progress(f"waiting {now - started:.0f} s for a place matching {wanted} at labgrid "
                                  f"coordinator {self.coordinator.address} ({ahead} reservation(s) ahead; "
                                  f"--device-lock-timeout {timeout_s:g} s): "
                                  f"{'; '.join(holder_text(p) for p in matching)}")
                    next_line = now + WAIT_LINE_S
                time.sleep(POLL_S)
        finally:
            for token in tokens:
                self.coordinator.cancel(token)

    def _ahead_of(self, token: str) -> int:
        reservations = self.coordinator.reservations()
        mine = next((r for r in reservations if r.token == token), None)
        return sum(1 for r in reservations if r.state == WAITING and mine is not None and r.created < mine.created)

    def _take(self, place: str, token: str | None, asked_at: float) -> None:
        """Acquire place and write this run's lease on it (clearing an expired quarantine)."""
        self.coordinator.acquire(place)
        now = time.time()
        with self._lock:
            self.held[place] = token
            self._times[place] = (asked_at, now)
        cleared = {tag: "" for tag in QUARANTINE_TAGS}
        self.coordinator.set_tags(place, {**cleared, "lease_until": str(int(now + self.settings.lease_ttl_s)),
                                          "lease_since": str(int(now)), "lease_host": self.host,
                                          "lease_pid": str(os.getpid()), "lease_run": self.run})

    def _take_over_stale(self, places: list[PlaceView]) -> None:
        """Release the places whose holder stopped renewing its lease (it died), and cancel its reservation, so
        that the coordinator allocates them to the oldest waiting reservation."""
        now = time.time()
        for place in places:
            until = _epoch(place, "lease_until")
            if place.acquired is None or until is None or until >= now or active_quarantine(place, now):
                continue
            self.progress(f"taking over {holder_text(place, now)}")
            self._free(place.name, place.acquired, place.reservation)

    def _free(self, place: str, holder: str | None, reservation: str | None) -> None:
        """Cancel the reservation a place was allocated through, then release the place from holder: in this order
        the coordinator allocates the place to the oldest waiting reservation at once (released first, the place
        would stay reserved until the coordinator's next periodic scheduling)."""
        if reservation:
            self.coordinator.cancel(reservation)
        if holder is not None:
            self.coordinator.release(place, from_user=holder)

    def _start_renewing(self) -> None:
        if self.held and self._renewer is None:
            self._renewer = threading.Thread(target=self._renew, name="labgrid-lease", daemon=True)
            self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.settings.lease_ttl_s / 4):
            with self._lock:
                held = list(self.held)
            for place in held:
                try:
                    self.coordinator.set_tags(place, {"lease_until": str(int(time.time() + self.settings.lease_ttl_s))})
                except FarmError as e:  # the coordinator is away: the lease runs out unless it comes back
                    self.progress(f"could not renew the lease of {place}: {e}")

    def _log(self, place: str, release_s: float) -> None:
        """Append the lease of place that just ended to $HARNESS_LOCK_LOG, when set."""
        path = os.environ.get("HARNESS_LOCK_LOG")
        asked_at, acquired_at = self._times.pop(place, (0.0, 0.0))
        if not path:
            return
        line = json.dumps({"device": place, "host": self.host, "pid": os.getpid(), "run": self.run,
                           "asked_at": asked_at, "acquired_at": acquired_at, "released_at": time.time(),
                           "release_s": round(release_s, 4)})
        with open(path, "a", encoding="utf-8") as log:  # one short line in append mode: whole, between processes
            log.write(line + "\n")

    # -- the quarantine store (as harness.farm.state.FarmState) ---------------------------------------------------

    def quarantined(self) -> dict[str, Quarantine]:
        """Return the farm's active quarantines by place."""
        quarantines = {}
        for name, place in self.coordinator.places().items():
            quarantine = active_quarantine(place)
            if quarantine is not None:
                quarantines[name] = quarantine
        return quarantines

    def quarantine(self, device: str, reason: str) -> Quarantine:
        """Quarantine a place for quarantine_hours, on the coordinator: it stays acquired after this run, named
        with the reason in its comment; return the entry."""
        now = time.time()
        until = now + self.quarantine_hours * 3600
        by = f"{self.host} pid {os.getpid()} run {self.run}"
        self.coordinator.set_comment(device, QUARANTINE_COMMENT + reason.splitlines()[0][:300])
        self.coordinator.set_tags(device, {"quarantine_until": str(int(until)), "quarantine_since": str(int(now)),
                                           "quarantine_by": by, "lease_until": str(int(until))})
        return Quarantine(device, f"{reason} (by {by})", _iso(now), _iso(until))

    def release(self, devices: list[str]) -> list[str]:
        """Clear the quarantine of places and release them (--unquarantine, from any host); return those that were
        quarantined."""
        if not devices:
            return []
        places = self.coordinator.places()
        released = []
        for name in devices:
            place = places.get(name)
            if place is None:
                raise FarmError(f"--unquarantine {name}: no such place at labgrid coordinator "
                                f"{self.coordinator.address} (places: {', '.join(sorted(places)) or 'none'})")
            if _epoch(place, "quarantine_until") is None:
                continue
            self.coordinator.set_tags(name, {tag: "" for tag in (*QUARANTINE_TAGS, *LEASE_TAGS)})
            if place.comment.startswith(QUARANTINE_COMMENT):
                self.coordinator.set_comment(name, "")
            self._free(name, place.acquired, place.reservation)
            released.append(name)
        return released

    # -- the end ---------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release every place this run holds (a quarantined one stays acquired, out of service) and cancel its
        reservations; then close the connection."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        with self._lock:
            held, self.held = dict(self.held), {}
        try:
            places = self.coordinator.places() if held else {}
            for name, token in held.items():
                place = places.get(name)
                if place is not None and active_quarantine(place) is not None:
                    continue
                release_started = time.time()
                self.coordinator.set_tags(name, {tag: "" for tag in LEASE_TAGS})
                self._free(name, self.coordinator.name, token)
                self._log(name, time.time() - release_started)
        finally:
            self.coordinator.close()


def _places_text(places: dict[str, PlaceView]) -> str:
    shown = [f"{name} ({_filter_text(_own_tags(p)) or 'no tags'})" for name, p in sorted(places.items())]
    return ", ".join(shown) or "none"


def _own_tags(place: PlaceView) -> dict[str, str]:
    """Return the tags a farm's admin gave the place (without the harness's lease and quarantine tags)."""
    return {k: v for k, v in place.tags.items() if k not in LEASE_TAGS and k not in QUARANTINE_TAGS}
