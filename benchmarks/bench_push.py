"""Does a second push of unchanged artifacts transfer nothing? Over SSH and over adb (and the emulator).

A typical artifact set (a 2 MB model, a 3.3 MB context binary, the device runner, 360 small input
files and their input list) is pushed three times per transport, each into a fresh work directory:

  first:        nothing on the device yet (every file is sent);
  second:       the same transport again (files it pushed are known: no remote command at all);
  second-fresh: a new connection (the device is asked for every hash, in one `sha256sum` command
                per batch of paths), which is what a new session pays.

Servers: a real sshd on 127.0.0.1 and the real adb server with the emulated adb device (the
helpers of tests/servers.py), all stopped afterwards. Prints one line per transport x push with
files sent/skipped, bytes sent and wall time, and the time of each second push against the first.

    python benchmarks/bench_push.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from harness.devices import AdbDevice, EmulatorDevice, SshDevice, load_devices_file  # noqa: E402
from harness.transports import open_transport  # noqa: E402
from servers import adb_server, emulated_phone, ssh_server  # noqa: E402


def make_artifacts(root: Path) -> Path:
    """Write the artifact set under root/artifacts; return that directory."""
    art = root / "artifacts"
    (art / "models").mkdir(parents=True)
    (art / "models" / "model.onnx").write_bytes(os.urandom(2 * 1024 * 1024))
    (art / "models" / "model_ctx_qnn.bin").write_bytes(os.urandom(3_300_000))
    (art / "bin").mkdir()
    (art / "bin" / "device_runner.py").write_bytes((REPO / "harness/runner/device_runner.py").read_bytes())
    lines = []
    for i in range(360):
        d = art / "data" / "inputs" / str(i)
        d.mkdir(parents=True)
        (d / "image.raw").write_bytes(os.urandom(256))
        lines.append(f"image:=inputs/{i}/image.raw")
    (art / "data" / "input_list.txt").write_text("\n".join(lines) + "\n")
    return art


def timed_push(transport, art: Path, remote: str) -> dict:
    start = time.perf_counter()
    result = transport.push(art, remote)
    return {"files_sent": result.files_sent, "files_skipped": result.files_skipped,
            "bytes_sent": result.bytes_sent, "time_s": time.perf_counter() - start}


def bench(name: str, connect, art: Path, rounds: int) -> list[dict]:
    """Run the three pushes `rounds` times; return one row per push kind (median time)."""
    runs: dict[str, list[dict]] = {"first": [], "second": [], "second-fresh": []}
    for r in range(rounds):
        remote = f"bench/round-{r}"
        with connect() as transport:
            runs["first"].append(timed_push(transport, art, remote))
            runs["second"].append(timed_push(transport, art, remote))
        with connect() as transport:
            runs["second-fresh"].append(timed_push(transport, art, remote))
            transport.remove("bench")
    rows = []
    first_s = statistics.median(x["time_s"] for x in runs["first"])
    for kind, xs in runs.items():
        t = statistics.median(x["time_s"] for x in xs)
        rows.append({"transport": name, "push": kind, **{k: xs[-1][k] for k in ("files_sent", "files_skipped",
                                                                                  "bytes_sent")},
                     "time_s": round(t, 4), "vs_first": round(t / first_s, 4)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    catalog = load_devices_file()
    soc = catalog.soc("sm8650")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        root = Path(tmp)
        art = make_artifacts(root)
        total = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
        n_files = sum(1 for p in art.rglob("*") if p.is_file())
        print(f"artifact set: {n_files} files, {total / 1e6:.2f} MB")
        emu = EmulatorDevice(id="emu", soc="sm8650", transport="emulator", sandbox=str(root / "emu"))
        rows += bench("emulator", lambda: open_transport(emu, soc, root), art, args.rounds)
        with ssh_server(root / "sshd") as sshd:
            entry = SshDevice(**sshd.device_entry(soc="sm8650", soc_detect="off"))
            rows += bench("ssh", lambda: open_transport(entry, soc, root), art, args.rounds)
        with adb_server(root / "adbhome") as adb, emulated_phone(adb, "sm8650", root / "phone") as phone:
            entry = AdbDevice(**phone.device_entry())
            rows += bench("adb", lambda: open_transport(entry, soc, root), art, args.rounds)
    print(f"{'transport':<9} {'push':<13} {'sent':>5} {'skipped':>7} {'bytes_sent':>11} {'time_s':>8} {'vs_first':>8}")
    for r in rows:
        print(f"{r['transport']:<9} {r['push']:<13} {r['files_sent']:>5} {r['files_skipped']:>7} "
              f"{r['bytes_sent']:>11} {r['time_s']:>8.3f} {r['vs_first']:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    ok = all(r["bytes_sent"] == 0 and r["files_sent"] == 0 for r in rows if r["push"] != "first")
    print("second push transfers nothing:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
