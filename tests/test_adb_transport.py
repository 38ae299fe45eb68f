"""The adb transport through Debian's real adb server, against the emulated adb device."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.devices import AdbDevice, load_devices_file
from harness.errors import ConfigError, DeviceLostError, DeviceTimeoutError, SocMismatchError, TransportError
from harness.runner.qnn_net_run import QNN_REMOTE_DIR, QnnNetRun, qnn_net_run_argv, qnn_net_run_files
from harness.transports import open_transport
from harness.transports.adb import resolve_qairt_sdk
from harness.transports.retry import Backoff
from servers import ADB, adb_server, emulated_phone, free_port

pytestmark = pytest.mark.skipif(ADB is None, reason="the `adb` binary is not installed")

ODD_NAMES = ["with space.txt", "it's.txt", 'say "hi".txt', "semi;colon.txt", "$(touch pwned).txt"]


@pytest.fixture(scope="module")
def adb(tmp_path_factory: pytest.TempPathFactory):
    with adb_server(tmp_path_factory.mktemp("adbhome")) as server:
        yield server


@pytest.fixture(scope="module")
def phone(adb, tmp_path_factory):
    with emulated_phone(adb, "sm8650", tmp_path_factory.mktemp("phone")) as p:
        yield p


@pytest.fixture(scope="module")
def catalog():
    return load_devices_file()


@pytest.fixture
def device(phone, catalog, tmp_path):
    transport = open_transport(AdbDevice(**phone.device_entry()), catalog.soc("sm8650"), tmp_path)
    yield transport
    transport.cleanup()
    transport.close()


def _local(phone, device, rel: str = "") -> Path:
    """Return the host path of a work-directory path on the emulated phone."""
    return phone.sandbox / device.workdir.lstrip("/") / rel


# --------------------------------------------------------------------------- commands


def test_shell_v2_exit_codes_and_streams(device):
    result = device.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout_s=20)
    assert (result.rc, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert device.run(["pwd"], timeout_s=20).stdout.strip().endswith("/data/local/tmp/harness")
    assert device.telemetry_source == "emulated" and device.runner_kind == "python"


def test_every_argument_is_quoted(device, phone):
    args = ODD_NAMES + ["a;b", "$HOME", "*", "'", '"', "x && touch pwned2", ""]
    result = device.run(["printf", "%s\\n", *args], timeout_s=20)
    assert result.stdout.split("\n")[:-1] == args
    assert not list(phone.sandbox.rglob("pwned*"))


def test_timeout_ends_the_shell(device, phone):
    start = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match=r"\[adb-dev\] command timed out after 1 s"):
        device.run(["sh", "-c", "echo $$ > sleeper.pid; sleep 30; touch slept"], timeout_s=1)
    assert time.monotonic() - start < 10
    pid = int(_local(phone, device, "sleeper.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid) and not _local(phone, device, "slept").exists()
    assert device.run(["true"], timeout_s=20).rc == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


# --------------------------------------------------------------------------- files


def test_push_skips_unchanged_files_pull_and_remove(device, phone, tmp_path):
    src = tmp_path / "src"
    (src / "sub dir").mkdir(parents=True)
    for name in ODD_NAMES:
        (src / name).write_text(f"content of {name}")
    (src / "sub dir" / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 5))  # > 1 MiB maxdata
    tool = src / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    first = device.push(src, "odd dir")
    assert (first.files_sent, first.files_skipped) == (len(ODD_NAMES) + 2, 0)
    second = device.push(src, "odd dir")
    assert (second.files_sent, second.bytes_sent) == (0, 0)
    assert device.run(["./odd dir/tool.sh"], timeout_s=20).stdout == "tool ran\n"
    back = tmp_path / "back"
    device.pull("odd dir", back)
    assert sorted(p.name for p in back.iterdir()) == sorted([*ODD_NAMES, "sub dir", "tool.sh"])
    assert (back / "sub dir" / "big.bin").read_bytes() == (src / "sub dir" / "big.bin").read_bytes()
    device.pull("odd dir/it's.txt", tmp_path / "one.txt")
    assert (tmp_path / "one.txt").read_text() == "content of it's.txt"
    with pytest.raises(TransportError, match="no such file on device"):
        device.pull("odd dir/nope", tmp_path / "nope")
    device.remove("odd dir/semi;colon.txt")
    assert not device.exists("odd dir/semi;colon.txt") and device.exists("odd dir/say \"hi\".txt")
    assert not list(phone.sandbox.rglob("pwned*"))


def test_cleanup_removes_the_work_directory(phone, catalog, tmp_path):
    transport = open_transport(AdbDevice(**phone.device_entry(workdir="/data/local/tmp/h5 cleanup")),
                               catalog.soc("sm8650"), tmp_path)
    transport.push(Path(__file__), "x/test.py")
    assert (phone.sandbox / "data/local/tmp/h5 cleanup/x/test.py").is_file()
    transport.cleanup()
    transport.close()
    assert not (phone.sandbox / "data/local/tmp/h5 cleanup").exists()


def test_adb_entry_keys_are_checked():
    base = {"id": "p", "soc": "sm8650", "transport": "adb", "serial": "R5CT"}
    assert AdbDevice(**base).workdir == "/data/local/tmp/harness"
    with pytest.raises(ValueError, match="pattern"):
        AdbDevice(**base, workdir="/sdcard/harness")
    with pytest.raises(ValueError, match="extra"):
        AdbDevice(**base, host="1.2.3.4")


# --------------------------------------------------------------------------- SoC detection


def test_soc_mismatch_stops_with_a_clear_error(phone, catalog, tmp_path):
    entry = AdbDevice(**phone.device_entry(soc="sm8550"))
    with pytest.raises(SocMismatchError, match=r"device adb-dev reports SM8650 \(getprop\), devices.yaml says sm8550"):
        open_transport(entry, catalog.soc("sm8550"), tmp_path)
    open_transport(AdbDevice(**phone.device_entry(soc="sm8550", soc_detect="off")), catalog.soc("sm8550"),
                   tmp_path).close()


def test_board_platform_is_used_without_ro_soc_model(adb, catalog, tmp_path):
    with emulated_phone(adb, "sm8550", tmp_path / "old", properties={"ro.soc.model": ""}) as old:
        open_transport(AdbDevice(**old.device_entry(soc="sm8550")), catalog.soc("sm8550"), tmp_path).close()
        with pytest.raises(SocMismatchError, match="reports kalama.*devices.yaml says sm8650"):
            open_transport(AdbDevice(**old.device_entry(soc="sm8650")), catalog.soc("sm8650"), tmp_path)


# --------------------------------------------------------------------------- faults


def test_disconnected_device_is_reconnected(device, adb, phone):
    device.backoff = Backoff(attempts=3, initial_s=0.2)
    adb.adb("disconnect", phone.serial)
    assert device.run(["echo", "back"], timeout_s=20).stdout == "back\n"
    assert device.lost_reason is None


def test_device_that_stops_answering_is_lost(adb, catalog, tmp_path):
    with emulated_phone(adb, "sm8650", tmp_path / "frozen", subprocess_mode=True) as frozen:
        transport = open_transport(AdbDevice(**frozen.device_entry()), catalog.soc("sm8650"), tmp_path)
        transport.backoff = Backoff(attempts=2, initial_s=0.1)
        transport.probe_timeout_s = transport.open_timeout_s = 1.0
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(DeviceLostError, match=r"device adb-dev (stopped answering|disconnected)"):
                transport.run(["sleep", "3"], timeout_s=1)
            with pytest.raises(DeviceLostError, match="was taken out of the session after"):
                transport.push(Path(__file__), "x.py")
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
            transport.close()


def test_adb_server_is_started_when_missing(catalog, tmp_path, monkeypatch):
    import harness.transports.adb as adb_module

    port = free_port()
    entry = AdbDevice(id="nowhere", soc="sm8650", transport="adb", serial="127.0.0.1:1", adb_port=port,
                      python=sys.executable)
    monkeypatch.setattr(adb_module.AdbTransport, "backoff", Backoff(attempts=1), raising=False)
    try:
        with pytest.raises(TransportError, match=r"cannot connect to 127\.0\.0\.1:1 .* after 1 tries"):
            open_transport(entry, catalog.soc("sm8650"), tmp_path)
        assert adb_module._server_up("127.0.0.1", port)
    finally:
        os.system(f"{ADB} -P {port} kill-server >/dev/null 2>&1")


# --------------------------------------------------------------------------- qnn-net-run


def _fake_sdk(root: Path, arch: int = 75) -> Path:
    """A QAIRT SDK layout whose qnn-net-run is a script recording its environment and arguments."""
    files = {
        "bin/aarch64-android/qnn-net-run": (
            "#!/bin/sh\n"
            'out=""; prev=""\n'
            'for a in "$@"; do [ "$prev" = "--output_dir" ] && out="$a"; prev="$a"; done\n'
            'mkdir -p "$out/Result_0"\n'
            'printf "%s\\n" "$@" > "$out/args.txt"\n'
            'printf "%s\\n%s\\n" "$LD_LIBRARY_PATH" "$ADSP_LIBRARY_PATH" > "$out/env.txt"\n'
            'head -c 40 /dev/zero > "$out/Result_0/logits.raw"\n'),
        "lib/aarch64-android/libQnnHtp.so": "htp",
        f"lib/aarch64-android/libQnnHtpV{arch}Stub.so": "stub",
        f"lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so": "skel",
        "lib/aarch64-android/libQnnSystem.so": "system",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "bin/aarch64-android/qnn-net-run").chmod(0o755)
    return root


def test_no_python_and_no_sdk_is_a_clear_error(phone, catalog, tmp_path, monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    entry = AdbDevice(**phone.device_entry(python=None))
    with pytest.raises(ConfigError, match=r"adb-dev' \(adb\) has no way to run models.*qairt_sdk.*QNN_SDK_ROOT"):
        open_transport(entry, catalog.soc("sm8650"), tmp_path)


def test_qnn_net_run_files_and_argv(tmp_path, monkeypatch):
    sdk = _fake_sdk(tmp_path / "qairt")
    files = qnn_net_run_files(sdk, 75)
    assert [remote for _, remote in files.files] == [
        "qnn/qnn-net-run", "qnn/libQnnHtp.so", "qnn/libQnnHtpV75Stub.so", "qnn/libQnnHtpV75Skel.so",
        "qnn/libQnnSystem.so"]
    assert files.files[3][0] == sdk / "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so"
    with pytest.raises(ConfigError, match=r"libQnnHtpV73Stub\.so.*libQnnHtpV73Skel\.so"):
        qnn_net_run_files(sdk, 73)
    argv = qnn_net_run_argv("/data/local/tmp/harness", "models/m_ctx.bin", "data/d/input_list.txt", "jobs/j/out",
                            "detailed")
    assert argv == [
        "env", "LD_LIBRARY_PATH=/data/local/tmp/harness/qnn",
        "ADSP_LIBRARY_PATH=/data/local/tmp/harness/qnn;/vendor/dsp/cdsp;/vendor/lib/rfsa/adsp;"
        "/system/lib/rfsa/adsp;/dsp",
        "/data/local/tmp/harness/qnn/qnn-net-run", "--backend", "/data/local/tmp/harness/qnn/libQnnHtp.so",
        "--retrieve_context", "models/m_ctx.bin", "--input_list", "data/d/input_list.txt",
        "--output_dir", "jobs/j/out", "--profiling_level", "detailed"]
    assert "--profiling_level" not in qnn_net_run_argv("/w/x", "c", "i", "o")
    monkeypatch.setenv("QNN_SDK_ROOT", str(sdk))
    assert resolve_qairt_sdk(None) == sdk and resolve_qairt_sdk("/opt/q") == Path("/opt/q")


def test_qnn_net_run_is_deployed_and_runs_with_its_libraries(phone, catalog, tmp_path, monkeypatch):
    monkeypatch.setenv("QNN_SDK_ROOT", str(_fake_sdk(tmp_path / "qairt")))
    transport = open_transport(AdbDevice(**phone.device_entry(python=None)), catalog.soc("sm8650"), tmp_path)
    try:
        assert transport.runner_kind == "qnn-net-run"
        with pytest.raises(ConfigError, match="has no `python:`.*qnn-net-run"):
            transport.python  # noqa: B018
        qnn = QnnNetRun(transport)
        assert qnn.deploy().files_sent == 5 and qnn.deploy().files_sent == 0
        assert _local(phone, transport, f"{QNN_REMOTE_DIR}/qnn-net-run").stat().st_mode & 0o111
        transport.push(Path(__file__), "models/m 1/m_ctx.bin")
        result = transport.run(qnn.argv("models/m 1/m_ctx.bin", "in;put.txt", "jobs/j1/out"), timeout_s=30)
        assert result.rc == 0, result.stderr
        out = tmp_path / "out"
        transport.pull("jobs/j1/out", out)
        assert (out / "Result_0" / "logits.raw").stat().st_size == 40
        assert (out / "args.txt").read_text().splitlines()[2:4] == ["--retrieve_context", "models/m 1/m_ctx.bin"]
        ld, adsp = (out / "env.txt").read_text().splitlines()
        assert ld.endswith("/data/local/tmp/harness/qnn") and adsp.split(";")[1:] == [
            "/vendor/dsp/cdsp", "/vendor/lib/rfsa/adsp", "/system/lib/rfsa/adsp", "/dsp"]
    finally:
        transport.cleanup()
        transport.close()
