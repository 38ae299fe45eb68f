"""The independent reference for an imported checkpoint: Hugging Face transformers runs the same checkpoint (its
own GGUF loader, Q/K un-permutation, RoPE, attention and MLP; GPT2LMHeadModel for GPT-2), and the harness's float pair must agree with it on
every prompt token (the same top-1 token, logits cosine >= MIN_COSINE). On disagreement the first layer whose
output diverges is named: the reference's per-layer outputs (forward hooks) against the imported prefill
graph's (its intermediate tensors made outputs).

The reference's outputs are cached per checkpoint content and prompt tokens (loading the checkpoint into
transformers takes most of a minute for a 135M model), so a re-run costs only the harness's side.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.cache import ArtifactCache
from harness.kpi import Limit
from harness.llm import llama
from harness.llm.device import FloatJudge
from harness.llm.importer import IMPORT_FILE, checkpoint_digest
from harness.runner import llm_runner
from harness.steps.report import StepReport

__all__ = ["MIN_COSINE", "ReferenceOutputs", "add_reference", "compare", "reference_outputs"]

MIN_COSINE = 0.999
REFERENCE_VERSION = 1
INSTALL_HINT = "pip install 'snapdragon-onboarding-harness[llm-reference]' (transformers, accelerate, torch)"


@dataclass(frozen=True)
class ReferenceOutputs:
    """transformers' logits [T, V] per prompt and its per-layer outputs [T, D] (embedding, blocks, final norm)."""

    implementation: str
    logits: list[np.ndarray]
    layers: list[np.ndarray]  # per prompt: [L + 2, T, D]


def _layer_names(layers: int) -> list[str]:
    """Return the compared layers' names, in order, as the harness's graphs name their outputs."""
    return ["embed.out", *(llama.block_output(i) for i in range(layers)), "norm.out"]


def _compared_modules(model) -> tuple:
    """Return the modules whose outputs are the compared layers: the embedding (for GPT-2 its dropout, whose
    input is token plus position embedding), each block, the final norm."""
    if hasattr(model, "transformer"):  # GPT2LMHeadModel
        t = model.transformer
        return (t.drop, *t.h, t.ln_f)
    inner = model.model
    return (inner.embed_tokens, *inner.layers, inner.norm)


def _run_transformers(checkpoint: Path, prompts: list[list[int]]) -> ReferenceOutputs:
    """Return transformers' outputs on the prompts (float32, CPU)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    checkpoint = Path(checkpoint)
    if checkpoint.is_file():
        model = AutoModelForCausalLM.from_pretrained(checkpoint.parent, gguf_file=checkpoint.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.eval()
    captured: list = []

    def keep(_module, _inputs, output):
        captured.append((output[0] if isinstance(output, tuple) else output)[0].detach().numpy().copy())

    hooks = [m.register_forward_hook(keep) for m in _compared_modules(model)]
    logits, layers = [], []
    try:
        with torch.no_grad():
            for ids in prompts:
                captured.clear()
                logits.append(model(torch.tensor([ids])).logits[0].numpy().astype(np.float32))
                layers.append(np.stack(captured).astype(np.float32))
    finally:
        for h in hooks:
            h.remove()
    return ReferenceOutputs(f"transformers {transformers.__version__} ({type(model).__name__})", logits, layers)


def reference_outputs(checkpoint: Path, prompts: list[list[int]], cache: ArtifactCache) -> ReferenceOutputs:
    """Return transformers' outputs on the prompts, cached per checkpoint content and prompt tokens."""
    key = hashlib.sha256(json.dumps([REFERENCE_VERSION, checkpoint_digest(checkpoint), prompts]).encode()).hexdigest()[:20]

    def build(out: Path) -> None:
        ref = _run_transformers(checkpoint, prompts)
        np.savez(out / "reference.npz", **{f"logits_{i}": x for i, x in enumerate(ref.logits)},
                 **{f"layers_{i}": x for i, x in enumerate(ref.layers)})
        (out / "implementation.txt").write_text(ref.implementation)

    entry = cache.entry("llm-reference", key, build).path
    with np.load(entry / "reference.npz") as data:
        return ReferenceOutputs((entry / "implementation.txt").read_text(),
                                [data[f"logits_{i}"] for i in range(len(prompts))],
                                [data[f"layers_{i}"] for i in range(len(prompts))])


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of a and b [..., N] (float64)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)


def compare(ours: list[np.ndarray], reference: list[np.ndarray]) -> list[dict]:
    """Return per prompt: tokens, top-1 agreement share, the first disagreeing position and the cosine range."""
    rows = []
    for k, (a, b) in enumerate(zip(ours, reference)):
        same = a.argmax(-1) == b.argmax(-1)
        cos = _cosine(a, b)
        rows.append({"prompt": k, "tokens": int(len(a)), "top1_agreement": round(float(same.mean()), 4),
                     "first_top1_mismatch": int(np.argmin(same)) if not same.all() else None,
                     "cosine_min": round(float(cos.min()), 6), "max_abs_diff": round(float(np.abs(a - b).max()), 5)})
    return rows


def _layer_divergence(source_prefill: Path, ids: list[int], reference: np.ndarray, layers: int) -> list[dict]:
    """Return the cosine of each layer's output of the imported prefill graph against the reference's, on the
    prompt's first AR tokens (one prefill call from an empty cache)."""
    import onnx
    import onnxruntime as ort

    names = _layer_names(layers)
    model = onnx.load(str(source_prefill))
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    graph = llm_runner.Graph(session, "prefill")
    n = min(len(ids), graph.ar)
    loop = llm_runner.KvLoop(np, graph)
    outs, _ = graph.run(loop._feed(graph, ids[:n]))
    return [{"layer": name, "cosine_min": round(float(_cosine(outs[name].reshape(graph.ar, -1)[:n],
                                                                reference[i][:n]).min()), 6)}
            for i, name in enumerate(names)]


def add_reference(report: StepReport, float_prefill: Path, float_decode: Path, source_prefill: Path,
                  checkpoint: Path, prompts: list[list[int]], cache: ArtifactCache) -> StepReport:
    """Add to the LLM conversion report the float pair's agreement with transformers on the prompts (KPIs
    reference_top1_agreement and reference_cosine_min, held to 1 and MIN_COSINE; the first diverging layer
    named on disagreement); inconclusive when transformers is not installed. Return report."""
    info = json.loads((Path(source_prefill).parent / IMPORT_FILE).read_text())
    report.kpis |= {"architecture": info["config"]["architecture"], "import_s": info["import_s"],
                    "graph_build_s": info["graph_build_s"]}
    try:
        reference = reference_outputs(checkpoint, prompts, cache)
    except ImportError as e:
        report.inconclusive.append(f"no independent reference: {e.name or e} is not installed ({INSTALL_HINT})")
        return report
    loop = FloatJudge(float_prefill, float_decode, 0.0).loop
    ours = []
    for ids in prompts:
        loop.reset()
        ours.append(loop.prefill(ids))
    rows = compare(ours, reference.logits)
    report.kpis |= {"reference": reference.implementation, "reference_prompts": len(rows),
                    "reference_tokens": sum(r["tokens"] for r in rows),
                    "reference_top1_agreement": min(r["top1_agreement"] for r in rows),
                    "reference_cosine_min": min(r["cosine_min"] for r in rows)}
    report.tables["reference_agreement"] = rows
    report.limits += [Limit("reference_top1_agreement", minimum=1.0, marginal=0.0),
                      Limit("reference_cosine_min", minimum=MIN_COSINE, marginal=0.0)]
    worst = min(rows, key=lambda r: (r["top1_agreement"], r["cosine_min"]))
    if worst["top1_agreement"] < 1.0 or worst["cosine_min"] < MIN_COSINE:
        k = worst["prompt"]
        layers = _layer_divergence(source_prefill, prompts[k], reference.layers[k], info["config"]["layers"])
        report.tables["reference_layers"] = layers
        first = next((row for row in layers if row["cosine_min"] < MIN_COSINE), None)
        where = (f"the first diverging layer is {first['layer']} (cosine {first['cosine_min']:.4f} on prompt {k})"
                 if first else "every layer agrees within the first AR tokens: the divergence is in the decode "
                               "graph or later tokens")
        report.failures.append(f"the float pair disagrees with {reference.implementation} on prompt {k}: top-1 "
                               f"agreement {worst['top1_agreement']}, cosine min {worst['cosine_min']}; {where}")
    return report
