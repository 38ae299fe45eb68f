"""A fake QAIRT SDK whose `qnn-net-run` is a stand-in for Qualcomm's binary (tests only).

The stand-in speaks qnn-net-run's command line (`--backend`, `--retrieve_context`, `--input_list`,
`--output_dir`, `--profiling_level`) and file layout (an input list of bare paths or `name:=path`
items, opened as given, i.e. relative to the cwd; a first `#`/`%` line naming outputs;
`OUTPUT_DIR/Result_<N>/<output name>.raw` in float32 with file-name-unsafe characters replaced
by '_'; `OUTPUT_DIR/qnn-profiling-data_0.log` when profiling). It runs the serialized context
through the EPContext wrapper beside it on onnxruntime's QNN EP, i.e. the HTP simulator of this
host, so its numbers are real HTP-simulator numbers. Its profiling "log" is the QNN EP's profile
CSV; the fake host `qnn-profile-viewer` copies it to `--output`, standing in for the real
viewer's conversion of the binary log to CSV. The HTP libraries are placeholder files (the stub
drops the LD_LIBRARY_PATH naming them, so that the QNN EP loads its own).
"""

from __future__ import annotations

from pathlib import Path

QNN_NET_RUN = r'''#!/usr/bin/env python3
"""Stand-in for Qualcomm's qnn-net-run (harness tests): same command line and output layout,
executed by onnxruntime's QNN EP on the EPContext wrapper that names the --retrieve_context file."""
import argparse
import glob
import os
import re
import sys


def parse_args():
    p = argparse.ArgumentParser(prog="qnn-net-run")
    p.add_argument("--backend", required=True)
    p.add_argument("--retrieve_context", required=True)
    p.add_argument("--input_list", required=True)
    p.add_argument("--output_dir", default="./output")
    p.add_argument("--profiling_level", choices=["basic", "detailed"])
    return p.parse_args()


def wrapper_for(context_file, onnx):
    """The EPContext model beside context_file whose node names it (what the binary stands for)."""
    name = os.path.basename(context_file)
    for path in sorted(glob.glob(os.path.join(os.path.dirname(context_file), "*.onnx"))):
        model = onnx.load(path, load_external_data=False)
        for node in model.graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "EPContext" and attrs.get("ep_cache_context", b"").decode() == name:
                return path, {p.key: p.value for p in model.metadata_props}
    sys.exit(f"qnn-net-run: cannot load context {context_file}")


def read_list(path, input_names):
    keep, lines = None, []
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            if lineno == 1 and line[0] in "#%":
                keep = line[1:].split()
                continue
            entry = {}
            for pos, item in enumerate(line.split()):
                name, sep, file = item.partition(":=")
                if not sep:
                    name, file = input_names[pos], item
                entry[name] = file  # opened as given: relative to the cwd
            lines.append(entry)
    return lines, keep


def without_placeholder_libraries():
    """Re-run this script without LD_LIBRARY_PATH: it names the SDK's placeholder libQnnHtp.so files
    pushed beside this script, which would shadow the QNN EP's own (real) HTP libraries."""
    if os.environ.get("LD_LIBRARY_PATH"):
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


def main():
    without_placeholder_libraries()
    args = parse_args()
    import numpy as np
    import onnx
    import onnxruntime as ort
    import onnxruntime_qnn

    model, props = wrapper_for(os.path.abspath(args.retrieve_context), onnx)
    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    options = {"backend_type": "htp", "enable_htp_fp16_precision": "1",
               "htp_arch": props["harness.htp_arch"], "soc_model": props["harness.soc_model"]}
    os.makedirs(args.output_dir, exist_ok=True)
    profile_csv = os.path.abspath(os.path.join(args.output_dir, "profile.csv"))
    if args.profiling_level:
        options.update(profiling_level=args.profiling_level, profiling_file_path=profile_csv)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices(devices, options)
    session = ort.InferenceSession(model, so)
    metas = {m.name: m for m in session.get_inputs()}
    lines, keep = read_list(args.input_list, list(metas))
    names = keep or [o.name for o in session.get_outputs()]
    for i, entry in enumerate(lines):
        feed = {n: np.fromfile(f, dtype=np.float32).reshape(metas[n].shape) for n, f in entry.items()}
        result_dir = os.path.join(args.output_dir, f"Result_{i}")
        os.makedirs(result_dir, exist_ok=True)
        for name, value in zip(names, session.run(names, feed)):
            safe = re.sub(r"[^A-Za-z0-9_]", "_", name)
            np.asarray(value, dtype=np.float32).tofile(os.path.join(result_dir, safe + ".raw"))
    del session  # the QNN EP writes its profile here
    if args.profiling_level:
        os.replace(profile_csv, os.path.join(args.output_dir, "qnn-profiling-data_0.log"))
        for extra in glob.glob(os.path.join(args.output_dir, "profile*")):
            os.remove(extra)


if __name__ == "__main__":
    main()
'''

QNN_PROFILE_VIEWER = r'''#!/usr/bin/env python3
"""Stand-in for the host's qnn-profile-viewer: `--input_log L --output CSV` (the stub log is a CSV)."""
import argparse
import shutil

p = argparse.ArgumentParser(prog="qnn-profile-viewer")
p.add_argument("--input_log", required=True)
p.add_argument("--output", required=True)
args = p.parse_args()
shutil.copyfile(args.input_log, args.output)
'''


def fake_qairt_sdk(root: Path, arch: int = 75) -> Path:
    """Create the fake SDK layout under root (stub qnn-net-run, stub host viewer, placeholder libraries);
    return root."""
    files = {
        "bin/aarch64-android/qnn-net-run": QNN_NET_RUN,
        "bin/x86_64-linux-clang/qnn-profile-viewer": QNN_PROFILE_VIEWER,
        "lib/aarch64-android/libQnnHtp.so": "placeholder",
        f"lib/aarch64-android/libQnnHtpV{arch}Stub.so": "placeholder",
        f"lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so": "placeholder",
        "lib/aarch64-android/libQnnSystem.so": "placeholder",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for tool in ("bin/aarch64-android/qnn-net-run", "bin/x86_64-linux-clang/qnn-profile-viewer"):
        (root / tool).chmod(0o755)
    return root
