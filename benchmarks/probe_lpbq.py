"""Which block-wise 4-bit weight forms the installed QNN EP runs on the HTP, and with which numerics.

One MatMul (x [1, 16, 256] uint16 QDQ, weight [256, 128] whose input rows differ in magnitude, as LLM weights'
do), its weight given in each form below; each graph run on the host CPU (onnxruntime's QDQ semantics) and on the
HTP (the simulator on x86-64) with CPU fallback disabled, with the EP's option enable_block_quant_weight_optimization
0 and 1. Prints the SQNR of each output against the float MatMul and against the host's run of the same graph, and
the QNN encoding of the weight tensor from the EP's QNN JSON dump (3 BW_AXIS_SCALE_OFFSET: per channel,
5 BLOCKWISE_EXPANSION: LPBQ, 11: the EP's float-block path).

    python benchmarks/probe_lpbq.py     # seconds
"""

from __future__ import annotations

import glob
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

M, K, N = 16, 256, 128
RNG = np.random.default_rng(0)
W = (RNG.standard_normal((K, N)) * 0.05 * np.exp(RNG.standard_normal((K, 1)) * 0.8)).astype(np.float32)
X = RNG.standard_normal((1, M, K)).astype(np.float32)
Y = X @ W


def _uint16(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = min(0.0, float(t.min()) * 1.05), max(0.0, float(t.max()) * 1.05)
    scale = (hi - lo) / 65535
    return np.array(scale, np.float32), np.array(round(-lo / scale), np.uint16)


def _int4(name: str, values: np.ndarray) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT4, values.shape, values.astype(np.int8).ravel().tolist())


def _graph(weight_nodes: list, inits: list) -> onnx.ModelProto:
    (xs, xz), (ys, yz) = _uint16(X), _uint16(Y)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]), *weight_nodes,
             helper.make_node("MatMul", ["xd", "w"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"])]
    inits += [numpy_helper.from_array(v, n) for n, v in (("xs", xs), ("xz", xz), ("ys", ys), ("yz", yz))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, M, K])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, M, N])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def per_channel() -> onnx.ModelProto:
    scale = np.abs(W).max(0) / 7
    return _graph([helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1)],
                  [_int4("wq", np.clip(np.round(W / scale), -8, 7)), numpy_helper.from_array(scale, "ws"),
                   _int4("wz", np.zeros(N))])


def _block_scales(block: int) -> np.ndarray:
    return (np.abs(W.reshape(K // block, block, N)).max(1) / 7).astype(np.float32)


def float_blocks(block: int) -> onnx.ModelProto:
    """A plain block-wise DequantizeLinear: one float scale per block."""
    scales = _block_scales(block)
    q = np.clip(np.round(W / np.repeat(scales, block, 0)), -8, 7)
    return _graph([helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0, block_size=block)],
                  [_int4("wq", q), numpy_helper.from_array(scales, "ws"), _int4("wz", np.zeros((K // block, N)))])


def lpbq(block: int, top: int = 16, quantize_in_graph: bool = False) -> onnx.ModelProto:
    """The LPBQ pattern: block scales = uint8 integers 1..top dequantized by a per-channel float scale."""
    scales = _block_scales(block)
    channel = (scales.max(0) / top).astype(np.float32)
    ints = np.clip(np.round(scales / channel), 1, top).astype(np.uint8)
    q = np.clip(np.round(W / np.repeat(ints * channel, block, 0)), -8, 7)
    nodes = [helper.make_node("DequantizeLinear", ["si", "sc", "sz"], ["ws"], axis=1)]
    inits = [numpy_helper.from_array(ints, "si"), numpy_helper.from_array(channel, "sc"),
             numpy_helper.from_array(np.zeros(N, np.uint8), "sz"), _int4("wz", np.zeros((K // block, N)))]
    if quantize_in_graph:
        nodes.append(helper.make_node("QuantizeLinear", ["wf", "ws", "wz"], ["wq"], axis=0, block_size=block))
        inits.append(numpy_helper.from_array(W, "wf"))
    else:
        inits.append(_int4("wq", q))
    nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0, block_size=block))
    return _graph(nodes, inits)


def _session(path: Path, htp: bool, optimization: str = "0", dump: Path | None = None):
    options = ort.SessionOptions()
    options.log_severity_level = 4
    if not htp:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    options.add_provider_for_devices(devices, {
        "backend_type": "htp", "htp_arch": "75", "soc_model": "57", "offload_graph_io_quantization": "0",
        "enable_block_quant_weight_optimization": optimization, "dump_json_qnn_graph": "1",
        "json_qnn_graph_dir": str(dump)})
    return ort.InferenceSession(str(path), options)


def _encoding(dump: Path) -> str:
    for f in glob.glob(str(dump / "*.json")):
        graph = json.loads(Path(f).read_text()).get("graph", {})
        for name, tensor in graph.get("tensors", {}).items():
            if tensor.get("type") == 4 and name.startswith("wq"):  # the static weight
                return str(tensor.get("quant_params", {}).get("encoding"))
    return "?"


def _sqnr(a: np.ndarray, reference: np.ndarray) -> float:
    return float(10 * np.log10((reference ** 2).mean() / ((a - reference) ** 2).mean()))


def main() -> None:
    import onnxruntime_qnn

    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    forms = {"per channel": per_channel(), "float blocks of 64": float_blocks(64),
             "float blocks of 32": float_blocks(32),
             **{f"LPBQ blocks of {b}": lpbq(b) for b in (8, 16, 32, 64, 128)},
             **{f"LPBQ 64, integers to {t}": lpbq(64, top=t) for t in (20, 32, 255)},
             "LPBQ 64, Q of float W in graph": lpbq(64, quantize_in_graph=True)}
    print(f"onnxruntime {ort.__version__}, onnxruntime-qnn {onnxruntime_qnn.__version__}; MatMul {M}x{K} @ {K}x{N}")
    print(f"{'weight form':>32} {'host/float dB':>13} | {'opt':>3} {'HTP/float dB':>12} {'HTP/host dB':>11} {'enc':>4}")
    with tempfile.TemporaryDirectory(prefix="probe-lpbq-") as tmp:
        for name, model in forms.items():
            path = Path(tmp) / "model.onnx"
            onnx.save(model, str(path))
            host = _session(path, False).run(None, {"x": X})[0]
            for optimization in ("0", "1"):
                dump = Path(tmp) / f"json-{len(list(Path(tmp).iterdir()))}"
                dump.mkdir()
                try:
                    out = _session(path, True, optimization, dump).run(None, {"x": X})[0]
                    row = f"{_sqnr(out, Y):>12.2f} {_sqnr(out, host):>11.2f} {_encoding(dump):>4}"
                except Exception as e:  # refused: a node would need the CPU
                    row = f"refused: {str(e).splitlines()[0][-70:]}"
                print(f"{name:>32} {_sqnr(host, Y):>13.2f} | {optimization:>3} {row}", flush=True)


if __name__ == "__main__":
    main()
