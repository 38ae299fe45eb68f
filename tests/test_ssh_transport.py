"""The SSH transport against a real OpenSSH server on 127.0.0.1 (started by the tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.devices import SshDevice, load_devices_file
from harness.errors import (ConfigError, DeviceLostError, DeviceTimeoutError, HostKeyError, SocMismatchError,
                            TransportError)
from harness.soc_detect import SocDetectionWarning
from harness.transports import open_transport
from harness.transports.retry import Backoff
from servers import SSHD, ssh_keygen, ssh_server

pytestmark = pytest.mark.skipif(not Path(SSHD).exists(), reason="openssh-server is not installed")

ODD_NAMES = ["with space.txt", "it's.txt", 'say "hi".txt', "semi;colon.txt", "$(touch pwned).txt", "back`tick`"]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    with ssh_server(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def catalog():
    return load_devices_file()


def _entry(sshd, tmp_path: Path, **extra) -> SshDevice:
    fields = sshd.device_entry(soc="sm8650", workdir=str(tmp_path / "workdir"), soc_detect="off")
    fields.update(extra)
    return SshDevice(**fields)


@pytest.fixture
def ssh(sshd, catalog, tmp_path):
    transport = open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path)
    yield transport
    transport.close()


def _session_pids(sshd) -> set[int]:
    """Return the pids of sshd's per-connection children."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(sshd.proc.pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


# --------------------------------------------------------------------------- commands


def test_run_returns_exit_code_stdout_stderr(ssh):
    result = ssh.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout_s=20)
    assert (result.rc, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert ssh.run(["pwd"], timeout_s=20).stdout.strip() == ssh.workdir


def test_every_argument_is_quoted(ssh, tmp_path):
    args = ODD_NAMES + ["a;b", "$HOME", "*", "'", '"', "x && touch pwned2", ""]
    result = ssh.run(["printf", "%s\\n", *args], timeout_s=20)
    assert result.stdout.split("\n")[:-1] == args
    assert not list(Path(ssh.workdir).glob("pwned*"))


def test_timeout_kills_the_remote_command(ssh):
    marker = Path(ssh.workdir) / "slept"
    start = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match=r"\[ssh-dev\] command timed out after 1 s"):
        ssh.run(["sh", "-c", "sleep 30; touch slept"], timeout_s=1)
    assert time.monotonic() - start < 10
    time.sleep(0.5)
    ps = subprocess.run(["pgrep", "-f", "sleep 30; touch slept"], capture_output=True, text=True)
    assert ps.stdout.strip() == "" and not marker.exists()
    assert ssh.run(["true"], timeout_s=20).rc == 0  # the device is still in the session


def test_python_is_the_entry_interpreter(ssh):
    result = ssh.run([*ssh.python, "-c", "import sys, onnxruntime; print(sys.version_info[0])"], timeout_s=60)
    assert result.stdout.strip() == "3", result.stderr


# --------------------------------------------------------------------------- files


def test_push_skips_unchanged_files_and_pull_round_trips(ssh, tmp_path):
    src = tmp_path / "src"
    (src / "sub dir").mkdir(parents=True)
    for name in ODD_NAMES:
        (src / name).write_text(f"content of {name}")
    (src / "sub dir" / "big.bin").write_bytes(os.urandom(300_000))
    tool = src / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    first = ssh.push(src, "odd dir")
    assert (first.files_sent, first.files_skipped) == (len(ODD_NAMES) + 2, 0)
    assert first.bytes_sent == sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    second = ssh.push(src, "odd dir")
    assert (second.files_sent, second.files_skipped, second.bytes_sent) == (0, len(ODD_NAMES) + 2, 0)
    (src / "it's.txt").write_text("changed")
    third = ssh.push(src, "odd dir")
    assert (third.files_sent, third.bytes_sent) == (1, len("changed"))
    assert ssh.run(["./odd dir/tool.sh"], timeout_s=20).stdout == "tool ran\n"  # exec bit kept
    hashes = ssh.sha256_many([f"odd dir/{n}" for n in ODD_NAMES] + ["odd dir/missing"])
    assert hashes["odd dir/missing"] is None and all(hashes[f"odd dir/{n}"] for n in ODD_NAMES)
    back = tmp_path / "back"
    ssh.pull("odd dir", back)
    assert sorted(p.name for p in back.iterdir()) == sorted([*ODD_NAMES, "sub dir", "tool.sh"])
    assert (back / "sub dir" / "big.bin").read_bytes() == (src / "sub dir" / "big.bin").read_bytes()
    ssh.pull("odd dir/say \"hi\".txt", tmp_path / "one.txt")
    assert (tmp_path / "one.txt").read_text() == 'content of say "hi".txt'
    with pytest.raises(TransportError, match="no such file on device"):
        ssh.pull("odd dir/nope", tmp_path / "nope")
    ssh.remove("odd dir/semi;colon.txt")
    assert not ssh.exists("odd dir/semi;colon.txt") and ssh.exists("odd dir/it's.txt")
    assert not list(Path(ssh.workdir).rglob("pwned*"))


def test_remote_paths_must_stay_in_the_work_directory(ssh):
    for bad in ("/etc/passwd", "../outside", "a/../../b"):
        with pytest.raises(TransportError, match="relative to the work directory"):
            ssh.sha256(bad)


def test_cleanup_removes_the_work_directory(sshd, catalog, tmp_path):
    transport = open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path)
    transport.push(Path(__file__), "x/test.py")
    assert (tmp_path / "workdir" / "x" / "test.py").is_file()
    transport.cleanup()
    transport.close()
    assert not (tmp_path / "workdir").exists()


def test_cleanup_leaves_a_work_directory_another_session_uses(sshd, catalog, tmp_path):
    first = open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path)
    second = open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path)  # e.g. an xdist worker
    first.push(Path(__file__), "models/first.py")
    first.remove(".")  # emptying the directory keeps the session markers
    assert not (tmp_path / "workdir" / "models").exists()
    assert len(list((tmp_path / "workdir" / ".sessions").iterdir())) == 2
    second.push(Path(__file__), "models/test.py")
    first.cleanup()
    first.close()
    assert (tmp_path / "workdir" / "models" / "test.py").is_file()
    stale = tmp_path / "workdir" / ".sessions" / f"{socket.gethostname()}-999999-dead"  # a crashed session
    stale.write_text("")
    second.cleanup()
    second.close()
    assert not (tmp_path / "workdir").exists()


@pytest.mark.parametrize("workdir", ["/", "/tmp", "relative/dir", "/tmp/../.."])
def test_dangerous_workdirs_are_refused(sshd, catalog, tmp_path, workdir):
    with pytest.raises(ConfigError, match="at least two levels deep"):
        open_transport(_entry(sshd, tmp_path, workdir=workdir), catalog.soc("sm8650"), tmp_path)


# --------------------------------------------------------------------------- host keys and auth


def test_unknown_host_key_is_refused_with_how_to_trust_it(sshd, catalog, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    with pytest.raises(HostKeyError) as info:
        open_transport(_entry(sshd, tmp_path, known_hosts=str(known)), catalog.soc("sm8650"), tmp_path)
    message = str(info.value)
    assert f"[127.0.0.1]:{sshd.port}" in message and "SHA256:" in message and "is not in" in message
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known}" in message
    assert "trust_on_first_use: true" in message
    assert known.read_text() == ""


def test_trust_on_first_use_records_the_key(sshd, catalog, tmp_path):
    known = tmp_path / "new" / "known_hosts"  # not there yet
    entry = _entry(sshd, tmp_path, known_hosts=str(known), trust_on_first_use=True)
    open_transport(entry, catalog.soc("sm8650"), tmp_path).close()
    line = known.read_text().strip()
    assert line == sshd.known_hosts_line().strip()
    strict = _entry(sshd, tmp_path, known_hosts=str(known))  # now a plain entry connects
    with open_transport(strict, catalog.soc("sm8650"), tmp_path) as transport:
        assert transport.run(["true"], timeout_s=20).rc == 0


@pytest.mark.parametrize("tofu", [False, True])
def test_changed_host_key_is_refused_even_with_tofu(sshd, catalog, tmp_path, tofu):
    other = ssh_keygen(tmp_path / "other_host_key").split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(HostKeyError, match=r"has CHANGED.*ssh-keygen -R '\[127\.0\.0\.1\]:\d+'"):
        open_transport(_entry(sshd, tmp_path, known_hosts=str(known), trust_on_first_use=tofu),
                       catalog.soc("sm8650"), tmp_path)
    assert known.read_text().count("\n") == 1


def test_wrong_key_and_missing_key_file(sshd, catalog, tmp_path):
    ssh_keygen(tmp_path / "stranger")
    with pytest.raises(TransportError, match="authentication as .* failed.*authorized_keys"):
        open_transport(_entry(sshd, tmp_path, key_file=str(tmp_path / "stranger")), catalog.soc("sm8650"), tmp_path)
    with pytest.raises(ConfigError, match="key_file .* does not exist"):
        open_transport(_entry(sshd, tmp_path, key_file=str(tmp_path / "none")), catalog.soc("sm8650"), tmp_path)


def test_ssh_entry_keys_are_checked(tmp_path):
    base = {"id": "b", "soc": "sm8650", "transport": "ssh", "host": "h", "user": "u", "key_file": "k"}
    SshDevice(**base, port=2222, known_hosts="kh", python="python3", workdir="/tmp/x")
    with pytest.raises(ValueError, match="extra"):
        SshDevice(**base, passwd="x")


# --------------------------------------------------------------------------- SoC detection


def test_soc_detection_on_a_host_without_socinfo_warns(sshd, catalog, tmp_path):
    with pytest.warns(SocDetectionWarning, match="does not report its SoC.*soc_detect: off"):
        open_transport(_entry(sshd, tmp_path, soc_detect="auto"), catalog.soc("sm8650"), tmp_path).close()
    with pytest.raises(SocMismatchError, match="soc_detect: require"):
        open_transport(_entry(sshd, tmp_path, soc_detect="require"), catalog.soc("sm8650"), tmp_path)


def test_soc_detection_reads_soc0(sshd, catalog, tmp_path, monkeypatch):
    import harness.soc_detect as soc_detect

    soc0 = tmp_path / "soc0"
    soc0.mkdir()
    (soc0 / "machine").write_text("QCS6490\n")
    (soc0 / "soc_id").write_text("497\n")
    monkeypatch.setattr(soc_detect, "LINUX_SOC_FILES", (str(soc0 / "machine"), str(soc0 / "soc_id"),
                                                        str(soc0 / "family")))
    with pytest.raises(SocMismatchError, match=r"device ssh-dev reports QCS6490 \(soc0\), devices.yaml says sm8650"):
        open_transport(_entry(sshd, tmp_path, soc_detect="auto"), catalog.soc("sm8650"), tmp_path)
    good = _entry(sshd, tmp_path, soc="qcs6490", soc_detect="auto")
    open_transport(good, catalog.soc("qcs6490"), tmp_path).close()


# --------------------------------------------------------------------------- faults


def _kill_connections(sshd) -> None:
    for pid in _session_pids(sshd):  # the server side of every open connection dies
        os.kill(pid, signal.SIGKILL)


def test_dropped_connection_is_retried(sshd, catalog, tmp_path):
    with open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path) as transport:
        transport.backoff = Backoff(attempts=3, initial_s=0.1)
        transport.run(["true"], timeout_s=20)
        _kill_connections(sshd)
        time.sleep(0.2)
        assert transport.run(["echo", "again"], timeout_s=20).stdout == "again\n"
        assert transport.lost_reason is None


def test_connection_dropped_mid_command_is_not_rerun(sshd, catalog, tmp_path):
    with open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path) as transport:
        transport.backoff = Backoff(attempts=3, initial_s=0.1)
        killer = threading.Timer(0.7, _kill_connections, args=(sshd,))
        killer.start()
        with pytest.raises(TransportError, match="connection dropped while `sh -c 'echo run"):
            transport.run(["sh", "-c", "echo run >> runs.txt; sleep 5"], timeout_s=20)
        killer.join()
        assert (Path(transport.workdir) / "runs.txt").read_text() == "run\n"  # ran once, not again
        assert transport.lost_reason is None and transport.run(["true"], timeout_s=20).rc == 0


def test_device_that_stops_answering_is_lost(sshd, catalog, tmp_path):
    transport = open_transport(_entry(sshd, tmp_path), catalog.soc("sm8650"), tmp_path)
    transport.backoff = Backoff(attempts=2, initial_s=0.1)
    transport.probe_timeout_s = transport.connect_timeout_s = 1.0
    frozen: list[int] = []

    def freeze() -> None:  # the whole "device": listener and connections
        frozen.extend([sshd.proc.pid, *_session_pids(sshd)])
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)

    timer = threading.Timer(0.5, freeze)
    timer.start()
    try:
        with pytest.raises(DeviceLostError, match=r"device ssh-dev stopped answering: .*timed out.*probe"):
            transport.run(["sleep", "5"], timeout_s=1.5)
        with pytest.raises(DeviceLostError, match="was taken out of the session after: stopped answering"):
            transport.run(["true"], timeout_s=20)
    finally:
        timer.join()
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        transport.close()
