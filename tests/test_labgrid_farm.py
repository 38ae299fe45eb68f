"""A farm of two hosts run by labgrid, with real parts: a `labgrid-coordinator` on 127.0.0.1 and two
`labgrid-exporter` processes standing for two hosts. host-a exports two SSH boards, host-b one SSH board and a phone
(the emulated adbd behind the real adb server, exported as an AdbDevice resource); the boards are real sshd's on
loopback running this host's Python and HTP simulator. The harness runs as users run it: `pytest suites/` in
subprocesses naming the coordinator in their devices file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from servers import ADB, LABGRID_COORDINATOR, SSHD, LabgridCoordinator, labgrid_farm

SUITES = Path(__file__).resolve().parent.parent / "suites"
FEW_STEPS = [str(SUITES / "test_01_feasibility.py"), str(SUITES / "test_02_conversion.py"),
             str(SUITES / "test_03_float_baseline.py")]

pytestmark = pytest.mark.skipif(not Path(LABGRID_COORDINATOR).exists() or ADB is None or not Path(SSHD).exists(),
                                reason="needs labgrid (the test extra), adb and openssh-server")


@dataclass
class Farm:
    """The coordinator, the devices file naming it, and where the runs keep their lease log."""

    coordinator: LabgridCoordinator
    devices_file: Path
    root: Path

    def run(self, pytester: pytest.Pytester, cache: Path, *args: str, host: str = "host-a",
            lock_log: Path | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess:
        """Return a finished `pytest ARGS` orchestrator run on `host` (LG_HOSTNAME) against this farm."""
        proc = self.start(pytester, cache, *args, host=host, lock_log=lock_log)
        out, _ = proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")

    def start(self, pytester: pytest.Pytester, cache: Path, *args: str, host: str = "host-a",
              lock_log: Path | None = None) -> subprocess.Popen:
        """Start `pytest ARGS` on `host` against this farm; return the process (output on stdout, merged)."""
        env = {**os.environ, "LG_HOSTNAME": host, "PYTHONUNBUFFERED": "1"}
        for name in ("LG_COORDINATOR", "HARNESS_RUN_ID", "CI_JOB_ID", "GITHUB_RUN_ID", "BUILD_TAG"):
            env.pop(name, None)  # each run its own id
        if lock_log is not None:
            env["HARNESS_LOCK_LOG"] = str(lock_log)
        return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--devices-file",
                                 str(self.devices_file), "--cache-dir", str(cache), *args], cwd=pytester.path,
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("labgrid-farm")
    with labgrid_farm(root, lease_ttl_s=6) as (coordinator, devices_file):
        yield Farm(coordinator, devices_file, root)


def _leases(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_two_orchestrators_share_the_farm_and_never_a_place(farm, pytester, session_cache_dir, tmp_path):
    """Two CI jobs started together, each asking for free sm8650 SSH boards (one with two pytest-xdist workers, so
    two boards): both pass, each on places of its own, no place is held by both at the same time (from their lease
    records), and every place and reservation is given back."""
    log = tmp_path / "leases.jsonl"
    args = [*FEW_STEPS, "--device", "soc=sm8650,transport=ssh", "--skip-validation", "-q"]
    jobs = [farm.start(pytester, session_cache_dir, *args, *extra, host=host, lock_log=log)
            for host, extra in (("host-a", ["-n", "2", "--dist", "loadgroup"]), ("host-b", []))]
    outputs = [job.communicate(timeout=600)[0] for job in jobs]
    for job, out, passed in zip(jobs, outputs, ("6 passed", "3 passed")):
        assert job.returncode == 0, out[-3000:]
        assert passed in out and "labgrid coordinator 127.0.0.1:" in out, out[-3000:]
    leases = _leases(log)
    by_run: dict[str, list[str]] = {}
    for lease in leases:
        by_run.setdefault(lease["run"], []).append(lease["device"])
    assert sorted(len(places) for places in by_run.values()) == [1, 2], leases
    assert all(lease["device"].startswith("board-") for lease in leases)
    for a in leases:
        for b in leases:
            if a is not b and a["device"] == b["device"]:  # the same place: one after the other
                assert a["released_at"] <= b["acquired_at"] or b["released_at"] <= a["acquired_at"], leases
    # every place went back: none is acquired, no reservation is left
    from harness.farm.labgrid_client import Coordinator

    with Coordinator(farm.coordinator.url) as coordinator:
        assert all(p.acquired is None for p in coordinator.places().values())
        assert coordinator.reservations() == []


def test_sigterm_releases_the_place_at_once(farm, pytester, session_cache_dir):
    """SIGTERM (a CI job cancelled) ends the run as Ctrl-C does, and its place goes back at once."""
    job = farm.start(pytester, session_cache_dir, *FEW_STEPS, "--device", "board-a1", "--skip-validation")
    deadline = time.monotonic() + 120
    while farm.coordinator.place("board-a1").tags.get("lease_pid") is None:
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0][-3000:]
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    out = job.communicate(timeout=120)[0]
    assert job.returncode == 2, out[-3000:]  # pytest's "interrupted"
    place = farm.coordinator.place("board-a1")
    assert place.acquired is None and place.reservation is None and "lease_until" not in place.tags, place


def test_a_killed_orchestrators_place_is_taken_over_within_its_lease(farm, pytester, session_cache_dir, tmp_path):
    """SIGKILL to an orchestrator holding the only place a second one waits for: the second takes the place over
    once the dead one's lease (6 s here) has run out, without a person, and passes."""
    first = farm.start(pytester, session_cache_dir, *FEW_STEPS, "--device", "board-b1", "--skip-validation",
                       host="host-a")
    try:
        deadline = time.monotonic() + 120
        while farm.coordinator.place("board-b1").tags.get("lease_pid") is None:  # it holds the place
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    killed_at = time.time()
    log = tmp_path / "leases.jsonl"
    second = farm.run(pytester, session_cache_dir, FEW_STEPS[0], "--device", "board-b1", "--skip-validation",
                      "--device-lock-timeout", "120", host="host-b", lock_log=log)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "taking over board-b1 held by host-a pid" in second.stdout, second.stdout[-3000:]
    (lease,) = _leases(log)
    # the bound the README states: the lease's time to live plus a poll (and this loaded host's slack)
    assert lease["acquired_at"] - killed_at <= 6 + 10, (lease, killed_at)


def test_a_quarantine_is_seen_and_released_from_the_other_host(farm, pytester, session_cache_dir):
    """host-a's run quarantines board-a2 (its health check fails); host-b's run skips it naming why, without
    connecting (exit 6); `--unquarantine board-a2` on host-b puts it back for everyone."""
    first = farm.run(pytester, session_cache_dir, FEW_STEPS[0], "--device", "board-a2", "--device-min-free-mb", "1e12",
                     "-rA", host="host-a")
    assert first.returncode == 6, first.stdout[-3000:]
    assert "board-a2 (sm8650, ssh): quarantined: health check failed" in first.stdout
    place = farm.coordinator.place("board-a2")
    assert place.acquired is not None and place.comment.startswith("quarantined by the harness: health check failed")
    second = farm.run(pytester, session_cache_dir, FEW_STEPS[0], "--device", "board-a2", "-rA", host="host-b")
    assert second.returncode == 6, second.stdout[-3000:]
    assert "device board-a2 is quarantined: health check failed" in second.stdout, second.stdout[-3000:]
    assert "(by host-a pid" in second.stdout
    third = farm.run(pytester, session_cache_dir, FEW_STEPS[0], "--device", "board-a2", "--unquarantine", "board-a2",
                     host="host-b")
    assert third.returncode == 0, third.stdout[-3000:]
    assert "taken out of quarantine by --unquarantine: board-a2" in third.stdout
    place = farm.coordinator.place("board-a2")
    assert place.acquired is None and "quarantine_until" not in place.tags and place.comment == ""


def test_a_phone_place_runs_through_its_exporters_adb_server(farm, pytester, session_cache_dir):
    result = farm.run(pytester, session_cache_dir, *FEW_STEPS[:2], "--device", "transport=adb", "-rA")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "device phone-b1 (sm8650, adb): healthy" in result.stdout, result.stdout[-3000:]


def test_bad_farm_input_is_one_line_naming_it(farm, pytester, session_cache_dir, tmp_path):
    """A coordinator that does not answer, a filter no place matches, a place without soc or with an unknown SoC,
    a place held outside the harness past the timeout: each one line naming it, no traceback."""
    coordinator = farm.coordinator
    coordinator.add_place("no-soc", "host-b/board1/NetworkService", transport="ssh")
    coordinator.add_place("odd-soc", "host-b/board1/NetworkService", soc="sm1234", transport="ssh")
    coordinator.add_place("held", "host-a/board1/NetworkService", soc="sm8550", transport="ssh",
                          python=sys.executable, workdir=str(tmp_path / "held"))
    coordinator.client("-p", "held", "acquire")
    try:
        cases = {
            ("--farm", "labgrid://127.0.0.1:9"): "labgrid coordinator 127.0.0.1:9 does not answer",
            ("--device", "soc=sm8750"): "no place matches soc=sm8750 at labgrid coordinator",
            ("--device", "no-soc"): "place no-soc has no soc tag",
            ("--device", "odd-soc"): "place odd-soc: unknown SoC soc=sm1234",
            ("--device", "sm8550", "--device-lock-timeout", "3"):
                "no place matching soc=sm8550 was free within 3 s (--device-lock-timeout): held held by ",
        }
        for args, expected in cases.items():
            result = farm.run(pytester, session_cache_dir, FEW_STEPS[0], *args, timeout_s=120)
            errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR: ")]
            assert result.returncode == 4 and len(errors) == 1 and expected in errors[0], (args, result.stdout[-2000:])
            assert "Traceback" not in result.stdout and "harness/farm" not in result.stdout, result.stdout[-2000:]
        # the place held outside the harness is named with how to free it, and was never taken over
        assert coordinator.place("held").acquired is not None
    finally:
        coordinator.client("-p", "held", "release")
        for name in ("no-soc", "odd-soc", "held"):
            coordinator.client("-p", name, "delete")
