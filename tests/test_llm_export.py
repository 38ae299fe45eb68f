"""Genie's graph pair: export (harness.llm.export), convention checks (harness.llm.convention) and the device-side
KV loop (harness/runner/llm_runner.py) against the numpy reference, on the CPU EP and on the HTP simulator."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from harness.errors import ModelError
from harness.llm import convention as cv
from harness.llm.export import export_pair
from harness.llm.gpt import GptConfig, forward, random_weights
from harness.runner import llm_runner as lr

CFG = GptConfig(vocab=64, context=16, prefill_ar=4, layers=2, heads=2, hidden=16, mlp=64)
RUNNER_DIR = Path(lr.__file__).parent


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1, scale=0.3)  # logits spread enough for stable greedy choices


@pytest.fixture(scope="module")
def pair(weights, tmp_path_factory) -> tuple[Path, Path]:
    return export_pair(weights, tmp_path_factory.mktemp("pair"))


def cpu_graph(path: Path, label: str) -> lr.Graph:
    return lr.Graph(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), label)


@pytest.fixture(scope="module")
def loop(pair) -> lr.KvLoop:
    return lr.KvLoop(np, cpu_graph(pair[0], "prefill"), cpu_graph(pair[1], "decode"))


def numpy_greedy(weights, prompt: list[int], max_new: int, stop_id: int | None = None) -> list[int]:
    seq, out = list(prompt), []
    while len(out) < max_new and len(seq) < weights.config.context:
        token = int(np.argmax(forward(weights, np.array(seq))[-1]))
        out.append(token)
        seq.append(token)
        if token == stop_id:
            break
    return out


def window_nll(weights, window) -> float:
    logits = forward(weights, np.array(window)).astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-sum(logp[i - 1, window[i]] for i in range(1, len(window))))


# --- export and convention ---------------------------------------------------------------------------------


def test_check_pair_accepts_the_export(pair):
    info = cv.check_pair(*pair)
    assert (info.layers, info.heads, info.head_dim, info.context_length, info.prefill_ar, info.vocab) == \
        (2, 2, 8, 16, 4, 64)
    assert info.input_names == ("input_ids", "attention_mask", "position_ids", "past_key_0_in", "past_value_0_in",
                                "past_key_1_in", "past_value_1_in")
    assert info.output_names == ("logits", "past_key_0_out", "past_value_0_out", "past_key_1_out",
                                 "past_value_1_out")


def test_export_is_deterministic_and_both_graphs_share_tensor_names(weights, pair, tmp_path):
    again = export_pair(weights, tmp_path)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in pair]
    prefill, decode = (onnx.load(str(p)) for p in pair)
    assert [i.name for i in prefill.graph.initializer] == [i.name for i in decode.graph.initializer]
    assert [(n.op_type, list(n.input), list(n.output)) for n in prefill.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in decode.graph.node]
    ops = {n.op_type for n in prefill.graph.node}
    assert "Erf" in ops and "Trilu" not in ops  # the PyTorch GELU form, for qnn_preprocess_model to fuse
    assert prefill.opset_import[0].version == 17
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_runner_repeats_the_convention_names():
    assert (lr.INPUT_IDS, lr.ATTENTION_MASK, lr.POSITION_IDS, lr.LOGITS) == \
        (cv.INPUT_IDS, cv.ATTENTION_MASK, cv.POSITION_IDS, cv.LOGITS)
    assert (lr.MASK_ATTEND, lr.MASK_BLOCKED) == (cv.MASK_ATTEND, cv.MASK_BLOCKED)
    assert [f(3) for f in (lr.past_key_in, lr.past_value_in, lr.past_key_out, lr.past_value_out)] == \
        [f(3) for f in (cv.past_key_in, cv.past_value_in, cv.past_key_out, cv.past_value_out)]
    source = (RUNNER_DIR / "llm_runner.py").read_text()
    assert "import harness" not in source and "from harness" not in source  # the harness is not on devices


def _tensor(graph: onnx.GraphProto, name: str) -> onnx.ValueInfoProto:
    return next(v for v in list(graph.input) + list(graph.output) if v.name == name)


def _set_shape(graph, name, dims):
    shape = _tensor(graph, name).type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_param = d if isinstance(d, str) else ""
        if not isinstance(d, str):
            shape.dim[-1].dim_value = d


def _drop(graph, *names):
    for field in (graph.input, graph.output):
        keep = [v for v in field if v.name not in names]
        del field[:]
        field.extend(keep)


def _rename(graph, old, new):
    _tensor(graph, old).name = new


def _renumber_layer_1_as_2(graph):
    for kv in ("key", "value"):
        _rename(graph, f"past_{kv}_1_in", f"past_{kv}_2_in")
        _rename(graph, f"past_{kv}_1_out", f"past_{kv}_2_out")


def _no_kv(graph):
    _drop(graph, *[n for n in [v.name for v in list(graph.input) + list(graph.output)] if n.startswith("past_")])


def _extra_input(graph):
    graph.input.append(onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT32, [1, 4]))


def _dtype(name, dtype):
    def edit(graph):
        _tensor(graph, name).type.tensor_type.elem_type = dtype
    return edit


def _ar_equals_cl(graph):
    _set_shape(graph, "input_ids", [1, 16])
    _set_shape(graph, "position_ids", [1, 16])
    _set_shape(graph, "attention_mask", [1, 1, 16, 16])


BAD_LAYOUTS = {
    "keys_transposed": ("decode", lambda g: _set_shape(g, "past_key_0_in", [2, 1, 15, 8]),
                        "decode.onnx: input 'past_key_0_in' has shape [2, 1, 15, 8]; Genie expects keys as "
                        "[H, 1, Dh, CL-AR] = [2, 1, 8, 15] (heads, 1, head dim, past context"),
    "values_transposed": ("prefill", lambda g: _set_shape(g, "past_value_1_in", [2, 1, 8, 12]),
                          "prefill.onnx: input 'past_value_1_in' has shape [2, 1, 8, 12]; Genie expects values as "
                          "[H, 1, CL-AR, Dh] = [2, 1, 12, 8] (heads, 1, past context, head dim"),
    "whole_cache_out": ("decode", lambda g: _set_shape(g, "past_key_0_out", [2, 1, 8, 16]),
                        "decode.onnx: output 'past_key_0_out' has shape [2, 1, 8, 16]; Genie expects new keys as "
                        "[H, 1, Dh, AR] = [2, 1, 8, 1] (heads, 1, head dim, new tokens only"),
    "missing_layer_values": ("prefill", lambda g: _drop(g, "past_value_1_in", "past_value_1_out"),
                             "prefill.onnx: layer 1 has no 'past_value_1_in' input nor 'past_value_1_out' output"),
    "in_without_out": ("decode", lambda g: _drop(g, "past_key_0_out"),
                       "decode.onnx: input 'past_key_0_in' has no matching output 'past_key_0_out'"),
    "out_without_in": ("decode", lambda g: _drop(g, "past_value_1_in"),
                       "decode.onnx: output 'past_value_1_out' has no matching input 'past_value_1_in'"),
    "layer_gap": ("decode", _renumber_layer_1_as_2,
                  "decode.onnx: KV tensors are numbered up to layer 2 but layer(s) 1 have none"),
    "no_kv": ("prefill", _no_kv, "prefill.onnx: no KV cache tensors: Genie expects inputs past_key_{l}_in"),
    "extra_input": ("prefill", _extra_input, "prefill.onnx: unexpected input(s) token_type_ids: Genie feeds only"),
    "ids_int64": ("prefill", _dtype("input_ids", onnx.TensorProto.INT64),
                  "prefill.onnx: input 'input_ids' is int64; Genie expects int32 [1, AR]"),
    "kv_float16": ("decode", _dtype("past_key_1_in", onnx.TensorProto.FLOAT16),
                   "decode.onnx: input 'past_key_1_in' is float16; Genie expects float32 [H, 1, Dh, CL-AR]"),
    "dynamic_ids": ("prefill", lambda g: _set_shape(g, "input_ids", [1, "seq"]),
                    "prefill.onnx: input 'input_ids' has shape [1, seq] with a dynamic or empty dim"),
    "mask_rank_3": ("prefill", lambda g: _set_shape(g, "attention_mask", [1, 4, 16]),
                    "prefill.onnx: input 'attention_mask' has shape [1, 4, 16]; Genie expects the attention mask as "
                    "[1, 1, AR, CL] = [1, 1, 4, CL]"),
    "prefill_ar_not_below_cl": ("prefill", _ar_equals_cl,
                                "prefill.onnx: input 'attention_mask' has shape [1, 1, 16, 16]: the context length "
                                "CL = 16 must exceed the AR = 16 tokens per call"),
    "logits_2d": ("decode", lambda g: _set_shape(g, "logits", [1, 64]),
                  "decode.onnx: output 'logits' has shape [1, 64]; Genie expects logits as [1, AR, V] = [1, 1, 64]"),
}


@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_check_pair_names_what_is_wrong(pair, tmp_path, case):
    which, edit, message = BAD_LAYOUTS[case]
    paths = {}
    for label, src in zip(("prefill", "decode"), pair):
        model = onnx.load(str(src))
        if label == which:
            edit(model.graph)
        paths[label] = tmp_path / src.name
        onnx.save(model, str(paths[label]))
    with pytest.raises(ModelError) as err:
        cv.check_pair(paths["prefill"], paths["decode"])
    assert message in str(err.value)


def test_check_pair_refuses_mismatched_or_misplaced_graphs(weights, pair, tmp_path):
    prefill, decode = pair
    with pytest.raises(ModelError, match=r"prefill.onnx: input 'input_ids' has shape \[1, 4\]; Genie expects the "
                                         r"decode graph to take one token per call: \[1, AR\] = \[1, 1\]"):
        cv.check_pair(prefill, prefill)
    with pytest.raises(ModelError, match="the files look swapped"):
        cv.check_pair(decode, prefill)
    other_vocab = export_pair(random_weights(GptConfig(**{**CFG.__dict__, "vocab": 32})), tmp_path / "v")[1]
    with pytest.raises(ModelError, match="disagree on the vocabulary V: 64 in prefill.onnx, 32 in decode.onnx"):
        cv.check_pair(prefill, other_vocab)
    other_cl = export_pair(random_weights(GptConfig(**{**CFG.__dict__, "context": 20})), tmp_path / "c")[1]
    with pytest.raises(ModelError, match="disagree on the context length CL: 16 in prefill.onnx, 20 in decode.onnx"):
        cv.check_pair(prefill, other_cl)
    with pytest.raises(ModelError, match="no such file"):
        cv.check_pair(tmp_path / "absent.onnx", decode)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelError, match="junk.onnx: not a readable ONNX model"):
        cv.check_pair(tmp_path / "junk.onnx", decode)


# --- the KV loop on the CPU EP --------------------------------------------------------------------------------


def test_kv_loop_logits_equal_the_reference_forward(weights, loop):
    seq = np.random.default_rng(0).integers(0, CFG.vocab, CFG.context)
    loop.reset()
    rows = [loop.prefill(seq[:6])]  # chunks of 4 and 2 (padded, masked)
    rows += [loop.decode(t)[None] for t in seq[6:13]]  # decode steps
    rows.append(loop.prefill(seq[13:16]))  # 13 > CL-AR cached: the decode graph takes these one by one
    assert [g for g, _ in loop.call_s] == ["prefill"] * 2 + ["decode"] * 10
    np.testing.assert_allclose(np.concatenate(rows), forward(weights, seq), atol=1e-4)
    with pytest.raises(lr.RunnerFailure, match="full"):
        loop.decode(0)


def test_prefill_chunks_fill_the_cache_up_to_its_end(weights, loop):
    seq = np.random.default_rng(1).integers(0, CFG.vocab, 15)
    loop.reset()
    got = np.concatenate([loop.prefill(seq[:3]), loop.prefill(seq[3:])])  # chunks at 3, 7, 11 (4 tokens to 15)
    assert [g for g, _ in loop.call_s] == ["prefill"] * 4
    np.testing.assert_allclose(got, forward(weights, seq), atol=1e-4)


@pytest.mark.parametrize("prompt, max_new", [([1, 2, 3], 6), ([5, 9, 11, 13, 17, 19], 20), ([7], 3)])
def test_greedy_generation_equals_numpy_greedy(weights, loop, prompt, max_new):
    result = loop.generate(prompt, max_new)
    assert result["generated_ids"] == numpy_greedy(weights, prompt, max_new)
    full = len(prompt) + max_new > CFG.context
    assert result["stop_reason"] == ("context_full" if full else "max_new")
    assert len(result["decode_token_s"]) == len(result["generated_ids"]) - 1
    assert result["time_to_first_token_s"] > 0 and result["prompt_tokens_per_s"] > 0


def test_generation_stops_at_the_stop_id_and_refuses_a_prompt_that_does_not_fit(weights, loop):
    ref = numpy_greedy(weights, [1, 2, 3], 6)
    stop = ref[2]
    result = loop.generate([1, 2, 3], 6, stop_id=stop)
    assert result["generated_ids"] == ref[:ref.index(stop) + 1] and result["stop_reason"] == "stop_id"
    with pytest.raises(lr.RunnerFailure, match="a prompt of 16 tokens does not fit the context length 16 .*at most 15"):
        loop.generate(list(range(16)), 4)


def test_window_nll_equals_the_reference(weights, loop):
    for window in ([3, 1, 4, 1], [5, 9, 2]):  # a full window and a padded one
        nll, count = loop.window_nll(window)
        assert count == len(window) - 1
        assert nll == pytest.approx(window_nll(weights, window), rel=1e-4)


@pytest.mark.parametrize("prompts", [
    [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9], [1, 2, 3, 7, 7, 7, 7]],  # 3 shared tokens fed once
    [[5, 9], [8, 8, 8]],  # nothing shared
    [[2] * 12, [2] * 11 + [3]],  # the shared start fills the prefill graph's cache: the decode graph takes the rest
])
def test_forced_top1_is_each_prefix_of_the_greedy_answers_argmax(weights, loop, prompts):
    answers = [numpy_greedy(weights, p, 3) for p in prompts]
    sequences = [{"ids": [*p, *a[:-1]], "from": len(p)} for p, a in zip(prompts, answers)]
    result = loop.forced_top1(sequences)
    assert [s["top1"] for s in result["sequences"]] == answers  # float on both sides: the argmax is the greedy token
    lcp = next(i for i, column in enumerate(zip(*prompts)) if len(set(column)) > 1)
    assert result["shared_tokens"] == min(lcp, min(len(p) for p in prompts) - 1)
    wrong = [{"ids": [*prompts[0], *[(t + 1) % CFG.vocab for t in answers[0][:-1]]], "from": len(prompts[0])}]
    assert loop.forced_top1(wrong)["sequences"][0]["top1"][0] == answers[0][0]  # the first choice sees the prompt only


# --- the runner's commands, as a device runs them -------------------------------------------------------------


@pytest.fixture(scope="module")
def device_bin(tmp_path_factory) -> Path:
    """The device's bin/: the two runner files alone."""
    bin_dir = tmp_path_factory.mktemp("device") / "bin"
    bin_dir.mkdir()
    for name in ("device_runner.py", "llm_runner.py"):
        shutil.copy(RUNNER_DIR / name, bin_dir / name)
    return bin_dir


def run_runner(device_bin: Path, *args: str) -> tuple[int, dict, str]:
    out = Path(args[args.index("--output_dir") + 1])
    proc = subprocess.run([sys.executable, str(device_bin / "llm_runner.py"), *args], capture_output=True,
                          text=True, cwd=device_bin.parent, timeout=300)
    return proc.returncode, json.loads((out / "result.json").read_text()), proc.stderr


def test_generate_command_on_cpu(weights, pair, device_bin, tmp_path):
    prompts = [[1, 2, 3], [5, 9, 11, 13, 17, 19]]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    rc, result, stderr = run_runner(device_bin, "generate", "--prefill", str(pair[0]), "--decode", str(pair[1]),
                                    "--prompts", str(tmp_path / "prompts.json"), "--max_new", "5",
                                    "--runtime", "cpu", "--output_dir", str(tmp_path / "out"))
    assert rc == 0, stderr
    assert result["error"] is None
    assert [p["generated_ids"] for p in result["prompts"]] == [numpy_greedy(weights, p, 5) for p in prompts]
    assert result["dims"] == {"context_length": 16, "prefill_ar": 4, "layers": 2, "heads": 2, "head_dim": 8,
                              "vocab": 64, "cache_slots": 15}
    assert all(s["session_create_s"] > 0 for s in result["sessions"].values())
    assert set(result["sessions"]["decode"]["nodes_by_ep"]) == {"CPUExecutionProvider"}
    assert result["peak_rss_mb"] > 0 and all(p["tokens_per_s"] > 0 for p in result["prompts"])


def test_generate_command_reports_bad_input_with_exit_code_2(pair, device_bin, tmp_path):
    (tmp_path / "prompts.json").write_text(json.dumps([list(range(16))]))
    rc, result, stderr = run_runner(device_bin, "generate", "--prefill", str(pair[0]), "--decode", str(pair[1]),
                                    "--prompts", str(tmp_path / "prompts.json"), "--max_new", "2",
                                    "--runtime", "cpu", "--output_dir", str(tmp_path / "out"))
    assert rc == 2 and "does not fit the context length 16" in result["error"] and "llm_runner:" in stderr
    rc, result, _ = run_runner(device_bin, "generate", "--prefill", str(pair[0]), "--decode", "absent.onnx",
                               "--prompts", str(tmp_path / "prompts.json"), "--max_new", "2",
                               "--runtime", "cpu", "--output_dir", str(tmp_path / "out2"))
    assert rc == 2 and result["error"] == "decode graph not found: absent.onnx"


def test_nll_command_on_cpu(weights, pair, device_bin, tmp_path):
    windows = np.random.default_rng(2).integers(0, CFG.vocab, (3, CFG.prefill_ar)).astype(np.int32)
    np.save(tmp_path / "windows.npy", windows)
    rc, result, stderr = run_runner(device_bin, "nll", "--prefill", str(pair[0]), "--windows",
                                    str(tmp_path / "windows.npy"), "--runtime", "cpu",
                                    "--output_dir", str(tmp_path / "out"))
    assert rc == 0, stderr
    expected = [window_nll(weights, w.tolist()) for w in windows]
    assert [w["nll"] for w in result["windows"]] == pytest.approx(expected, rel=1e-4)
    assert [w["count"] for w in result["windows"]] == [3, 3, 3] and result["token_count"] == 9
    assert result["perplexity"] == pytest.approx(np.exp(sum(expected) / 9), rel=1e-4)


def test_nll_command_with_sequences_returns_their_teacher_forced_argmax(weights, pair, device_bin, tmp_path):
    windows = np.array([[3, 1, 4, 1]], np.int32)
    np.save(tmp_path / "windows.npy", windows)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14]]
    answers = [numpy_greedy(weights, p, 2) for p in prompts]
    (tmp_path / "seqs.json").write_text(json.dumps([{"ids": [*p, *a[:-1]], "from": len(p)}
                                                    for p, a in zip(prompts, answers)]))
    common = ["nll", "--prefill", str(pair[0]), "--windows", str(tmp_path / "windows.npy"), "--sequences",
              str(tmp_path / "seqs.json"), "--runtime", "cpu"]
    rc, result, stderr = run_runner(device_bin, *common, "--decode", str(pair[1]), "--output_dir", str(tmp_path / "a"))
    assert rc == 0, stderr
    assert [s["top1"] for s in result["forced"]["sequences"]] == answers and result["forced"]["shared_tokens"] == 12
    assert result["token_count"] == 3
    # 12 shared tokens leave fewer than AR slots: without the decode graph the runner says so
    rc, result, _ = run_runner(device_bin, *common, "--output_dir", str(tmp_path / "b"))
    assert rc == 2 and "there is no decode graph" in result["error"]
    (tmp_path / "seqs.json").write_text(json.dumps([{"ids": [1, 2], "from": 3}]))
    rc, result, _ = run_runner(device_bin, *common, "--output_dir", str(tmp_path / "c"))
    assert rc == 2 and "sequence 0 has 2 tokens and from 3" in result["error"]
    (tmp_path / "seqs.json").write_text(json.dumps([[1, 2]]))
    rc, result, _ = run_runner(device_bin, *common, "--output_dir", str(tmp_path / "d"))
    assert rc == 2 and 'expected a non-empty JSON list of {"ids"' in result["error"]


# --- the HTP simulator ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qdq_pair(pair, loop, tmp_path_factory) -> tuple[Path, Path]:
    """The pair after qnn_preprocess_model (Erf GELU fused into Gelu), quantized w8a16 with get_qnn_qdq_config
    on the inputs the CPU KV loop fed each graph."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    out = tmp_path_factory.mktemp("qdq")
    feeds = {"prefill": [], "decode": []}

    def recording(run, bucket):
        return lambda feed: bucket.append({k: v.copy() for k, v in feed.items()}) or run(feed)

    for graph in (loop.prefill_graph, loop.decode_graph):
        graph.run = recording(graph.run, feeds[graph.label])
    rng = np.random.default_rng(3)
    for _ in range(4):
        loop.generate(rng.integers(0, CFG.vocab, 5).tolist(), 8)
    for graph in (loop.prefill_graph, loop.decode_graph):
        del graph.run

    class Reader(CalibrationDataReader):
        def __init__(self, items):
            self.items = iter(items)

        def get_next(self):
            return next(self.items, None)

    paths = []
    for label, src in zip(("prefill", "decode"), pair):
        pre, qdq = out / f"{label}_pre.onnx", out / f"{label}.onnx"
        assert qnn_preprocess_model(str(src), str(pre))  # True: the model changed (the GELU fused)
        config = get_qnn_qdq_config(str(pre), Reader(feeds[label]), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8)
        quantize(str(pre), str(qdq), config)
        ops = {n.op_type for n in onnx.load(str(qdq)).graph.node}
        assert {"Gelu", "QuantizeLinear", "DequantizeLinear"} <= ops and "Erf" not in ops
        paths.append(qdq)
    return paths[0], paths[1]


def test_generate_on_the_htp_simulator_matches_cpu_greedy(weights, qdq_pair, device_bin, tmp_path):
    prompts = [[1, 2, 3], [5, 9, 11, 13, 17, 19]]
    cv.check_pair(*qdq_pair)  # quantization keeps the float I/O convention
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    rc, result, stderr = run_runner(device_bin, "generate", "--prefill", str(qdq_pair[0]), "--decode",
                                    str(qdq_pair[1]), "--prompts", str(tmp_path / "prompts.json"), "--max_new", "4",
                                    "--runtime", "htp", "--htp_arch", "75", "--soc_model", "57",
                                    "--output_dir", str(tmp_path / "out"))
    assert rc == 0, stderr
    for label in ("prefill", "decode"):
        session = result["sessions"][label]
        assert session["cpu_fallback_disabled"]  # session.disable_cpu_ep_fallback: nothing could run on the CPU
        assert session["provider_options"]["backend_type"] == "htp"
        assert (session["provider_options"]["htp_arch"], session["provider_options"]["soc_model"]) == ("75", "57")
        assert list(session["nodes_by_ep"]) == ["QNNExecutionProvider"] and session["nodes_by_ep"][
            "QNNExecutionProvider"] > 100  # every Q/DQ and compute node
    assert [p["generated_ids"] for p in result["prompts"]] == [numpy_greedy(weights, p, 4) for p in prompts]
