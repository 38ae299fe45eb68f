"""The decode speed a SoC's memory bandwidth allows: an ESTIMATE, beside Genie's measured tokens/s.

Generating one token reads every weight of the decode graph once (an embedding table only the token's row)
and the whole KV cache: at the catalog's peak DRAM bandwidth that bounds tokens/s from above. For Llama 3.2 1B
(1.24 B parameters) at 4 bits on sm8650's 76.8 GB/s: 76.8e9 / 0.62e9 = about 124 tokens/s. A figure from a
phone reads against this physical limit (and against ExecuTorch's published floors); the simulator's does not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from harness.devices import SocSpec

__all__ = ["decode_ceiling", "weight_bytes_per_token"]

_BYTES = {onnx.TensorProto.INT4: 0.5, onnx.TensorProto.UINT4: 0.5}


def _bytes(init: onnx.TensorProto) -> float:
    """Return an initializer's size as stored (4-bit types at half a byte)."""
    size = _BYTES.get(init.data_type) or np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    return int(np.prod(init.dims)) * size


def weight_bytes_per_token(model: onnx.ModelProto) -> int:
    """Return the bytes of weights one decode call reads: every initializer as stored, a table a Gather indexes
    (directly or through its DequantizeLinear) at one row."""
    inits = {i.name: i for i in model.graph.initializer}
    source = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    gathered = {source.get(n.input[0], n.input[0]) for n in model.graph.node if n.op_type == "Gather"}
    total = 0.0
    for name, init in inits.items():
        rows = int(init.dims[0]) if name in gathered and init.dims else 1
        total += _bytes(init) / rows
    return int(total)


def decode_ceiling(decode_graph: Path, kv_cache_bytes: int, soc: SocSpec,
                   measured_tokens_per_s: float | None) -> dict:
    """Return the bandwidth ceiling KPIs (labelled estimates): weight and KV bytes per token, the ceiling in
    tokens/s over the catalog's DRAM bandwidth, and the measured rate's share of it; {} when the catalog has no
    bandwidth for the SoC."""
    if soc.ddr_bandwidth_gbps is None:
        return {"decode_bandwidth_ceiling_basis": f"not estimated: the catalog has no DRAM bandwidth for {soc.id}"}
    weights = weight_bytes_per_token(onnx.load(str(decode_graph)))
    ceiling = soc.ddr_bandwidth_gbps * 1e9 / (weights + kv_cache_bytes)
    out = {"decode_weight_bytes_per_token": weights, "decode_kv_bytes_per_token": int(kv_cache_bytes),
           "decode_bandwidth_ceiling_tokens_per_s": round(ceiling, 1),
           "decode_bandwidth_ceiling_basis": (
               f"estimate: ({weights / 1e6:.1f} MB of weights + {kv_cache_bytes / 1e6:.2f} MB of KV cache at the "
               f"full context) read per token over {soc.id}'s {soc.ddr_bandwidth_gbps:g} GB/s peak DRAM bandwidth "
               f"({soc.perf_source or 'catalog'})")}
    if measured_tokens_per_s:
        out["tokens_per_s_of_bandwidth_ceiling"] = round(measured_tokens_per_s / ceiling, 4)
    return out
