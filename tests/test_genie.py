"""Genie: the bundle writer (harness.llm.genie_config) and the device-side ctypes driver over libGenie.so
(harness/runner/genie_runner.py) on a tiny GPT pair compiled to context binaries for the HTP simulator, checked
against llm_runner's greedy KV loop on the same binaries."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from harness.errors import ConfigError
from harness.llm.export import export_pair
from harness.llm.genie_config import (CONFIG_FILE, EXTENSIONS_FILE, TOKENIZER_FILE, genie_config,
                                      htp_backend_ext_config, write_bundle)
from harness.llm.genie_steps import stress_prompts
from harness.llm.gpt import GptConfig, random_weights
from harness.runner import genie_runner as gr
from harness.runner import llm_runner as lr
from harness.zoo import tiny_gpt

CFG = GptConfig(vocab=tiny_gpt.VOCAB_SIZE, context=64, prefill_ar=16, layers=1, heads=2, hidden=64, mlp=128)
RUNNER_DIR = Path(gr.__file__).parent
FAKE_T2T = Path(__file__).parent / "fake_genie_t2t_run.py"
MAX_NEW = 12
TIMEOUT_S = 300


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_gpt.train_tokenizer()


@pytest.fixture(scope="session")
def tokenizer_file(tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(tokenizer.to_str())
    return path


def partial_tokens(tokenizer) -> list[int]:
    """Token ids that do not decode to whole UTF-8 characters on their own (byte-level BPE fragments)."""
    return [i for i in range(tokenizer.get_vocab_size()) if "\ufffd" in tokenizer.decode([i])]


@pytest.fixture(scope="session")
def weights(tokenizer):
    """Random weights whose greedy choice never is a byte fragment (Genie's streaming decoder holds those back
    until a character completes, so random bytes would leave its text empty) nor the EOT token (so every query
    runs to its token limit): final LayerNorm feature 0 is made a constant 1 and its lm_head row pushes those
    tokens' logits down."""
    w = random_weights(CFG, seed=1, scale=0.3)
    lnf_g, lnf_b, lm_head = w.lnf_g.copy(), w.lnf_b.copy(), w.lm_head.copy()
    lnf_g[0], lnf_b[0] = 0.0, 1.0
    lm_head[0, :] = 0.0
    lm_head[0, partial_tokens(tokenizer) + [tiny_gpt.EOT_ID]] = -8.0
    return replace(w, lnf_g=lnf_g, lnf_b=lnf_b, lm_head=lm_head)


@pytest.fixture(scope="session")
def contexts(weights, cache, devices, tmp_path_factory):
    """(prefill, decode) ContextBinary: export_pair -> qnn_preprocess_model -> w8a16 QDQ (calibrated on the
    inputs a CPU KV loop fed each graph) -> the QNN EP's EP-context binaries for sm8650."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    from harness.steps.context_binary import compile_context

    out = tmp_path_factory.mktemp("genie_pair")
    pair = export_pair(weights, out)
    graphs = [lr.Graph(ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]), label)
              for p, label in zip(pair, ("prefill", "decode"))]
    feeds = {"prefill": [], "decode": []}
    for g in graphs:
        run, bucket = g.run, feeds[g.label]
        g.run = (lambda run, bucket: lambda feed: bucket.append({k: v.copy() for k, v in feed.items()}) or run(feed))(
            run, bucket)
    loop = lr.KvLoop(np, *graphs)
    rng = np.random.default_rng(3)
    for _ in range(3):
        loop.generate(rng.integers(0, CFG.vocab, 20).tolist(), 6)

    class Reader(CalibrationDataReader):
        def __init__(self, items):
            self.items = iter(items)

        def get_next(self):
            return next(self.items, None)

    soc = devices.soc("sm8650")
    binaries = []
    for label, src in zip(("prefill", "decode"), pair):
        pre, qdq = out / f"{label}_pre.onnx", out / f"{label}_qdq.onnx"
        qnn_preprocess_model(str(src), str(pre))
        config = get_qnn_qdq_config(str(pre), Reader(feeds[label]), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8)
        quantize(str(pre), str(qdq), config)
        binaries.append(compile_context(qdq, soc, cache))
    return tuple(binaries)


def _bin(ctx) -> Path:
    return next(p for p in ctx.files if p.suffix == ".bin")


@pytest.fixture(scope="session")
def bundle(contexts, tokenizer_file, tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("bundle"), [_bin(c) for c in contexts], tokenizer_file,
                        context_length=CFG.context, soc_model=57, dsp_arch="v75", eot_id=tiny_gpt.EOT_ID,
                        kv_dim=CFG.head_dim)


@pytest.fixture(scope="session")
def device_bin(tmp_path_factory) -> Path:
    """A device's bin/: the runners (and the fake genie-t2t-run beside them)."""
    d = tmp_path_factory.mktemp("device_bin")
    for name in ("device_runner.py", "genie_runner.py", "llm_runner.py"):
        shutil.copy(RUNNER_DIR / name, d / name)
    fake = d / "genie-t2t-run"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_T2T.read_text())
    shutil.copy(FAKE_T2T, d / FAKE_T2T.name)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return d


def run_genie(device_bin: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    """Run genie_runner.py as a script (it re-executes itself with libGenie's folder on LD_LIBRARY_PATH)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", gr.REEXEC_ENV)}
    proc = subprocess.run([sys.executable, str(device_bin / "genie_runner.py"), *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env={**environ, **(env or {})})
    out = Path(args[args.index("--output_dir") + 1])
    return proc.returncode, json.loads((out / "result.json").read_text()), proc.stderr


def write_prompts(path: Path, prompts: list) -> str:
    path.write_text(json.dumps(prompts))
    return str(path)


TEXT_PROMPTS = ["The assert statement", "Lambda expressions are used to create anonymous functions"]


# --- the config and the bundle (no Genie) ------------------------------------------------------------------


def test_genie_config_holds_what_genie_requires():
    config = genie_config(context_length=64, n_vocab=1024, ctx_bins=["a.bin", "b.bin"], eot_id=0, kv_dim=32,
                          stop_sequences=["\n\n"])
    d = config["dialog"]
    assert d["type"] == "basic" and d["stop-sequence"] == ["\n\n"]
    assert d["context"] == {"version": 1, "size": 64, "n-vocab": 1024, "bos-token": -1, "eos-token": 0,
                            "eot-token": 0}
    assert d["sampler"]["top-k"] == 1 and d["sampler"]["seed"] == 42  # greedy
    assert d["tokenizer"] == {"version": 1, "path": TOKENIZER_FILE}
    backend, model = d["engine"]["backend"], d["engine"]["model"]
    assert backend["type"] == "QnnHtp" and backend["extensions"] == EXTENSIONS_FILE
    assert {"version", "spill-fill-bufsize", "mmap-budget", "use-mmap", "cpu-mask", "poll"} <= set(backend["QnnHtp"])
    assert backend["QnnHtp"]["kv-dim"] == 32
    assert model["binary"]["ctx-bins"] == ["a.bin", "b.bin"] and model["positional-encoding"] == {"type": "absolute"}
    ext = htp_backend_ext_config(57, "v75")
    assert ext["devices"][0]["soc_model"] == 57 and ext["devices"][0]["dsp_arch"] == "v75"
    assert ext["devices"][0]["cores"][0]["perf_profile"] == "burst" and ext["memory"]["mem_type"] == "shared_buffer"
    assert "dsp_arch" not in htp_backend_ext_config(57, None)["devices"][0]
    for bad in (dict(eot_id=2000), dict(top_k=0), dict(ctx_bins=[]), dict(kv_dim=0)):
        with pytest.raises(ConfigError):
            genie_config(**{**dict(context_length=64, n_vocab=1024, ctx_bins=["a.bin"], eot_id=0, kv_dim=32), **bad})
    with pytest.raises(ConfigError, match="v75"):
        htp_backend_ext_config(57, "75")


def test_write_bundle_copies_and_names_files_relatively(tmp_path, tokenizer_file):
    a, b = tmp_path / "a" / "model_ctx_qnn.bin", tmp_path / "b" / "model_ctx_qnn.bin"
    for p, data in ((a, b"prefill"), (b, b"decode")):
        p.parent.mkdir()
        p.write_bytes(data)
    path = write_bundle(tmp_path / "bundle", [a, b], tokenizer_file, context_length=64, soc_model=57,
                        dsp_arch="v75", eot_id=0, kv_dim=32)
    assert path == tmp_path / "bundle" / CONFIG_FILE
    config = json.loads(path.read_text())
    bins = config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert bins == ["part_1_of_2.bin", "part_2_of_2.bin"]  # the QNN EP names every binary alike
    assert [(path.parent / n).read_bytes() for n in bins] == [b"prefill", b"decode"]
    assert config["dialog"]["context"]["n-vocab"] == 1024  # from the tokenizer
    assert (path.parent / TOKENIZER_FILE).read_text() == tokenizer_file.read_text()
    assert json.loads((path.parent / EXTENSIONS_FILE).read_text())["devices"][0]["soc_model"] == 57
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary files left
    with pytest.raises(ConfigError, match="not found"):
        write_bundle(tmp_path / "x", [tmp_path / "missing.bin"], tokenizer_file, context_length=64, soc_model=57,
                     dsp_arch="v75", eot_id=0, kv_dim=32)


def test_status_codes_are_named_from_genie_common():
    assert gr.status_name(-6) == "GENIE_STATUS_ERROR_QUERY_FAILED"
    assert gr.status_text(4).startswith("GENIE_STATUS_WARNING_CONTEXT_EXCEEDED (4): the context limit")
    assert set(gr.STATUS) == set(range(-14, 5))  # every code GenieCommon.h defines
    assert gr.status_name(-99) == "GENIE_STATUS_UNKNOWN_-99" and "does not define" in gr.status_text(-99)
    assert gr.GenieError("GenieDialog_create", -8).code == 2 and gr.GenieError("GenieDialog_query", -6).code == 3


def test_parse_t2t_stdout():
    out = "Using libGenie.so version 1.21.0\n\n[PROMPT]: hi\n\n[BEGIN]:  there, you[END]\n"
    assert gr.parse_t2t_stdout(out) == (" there, you", "1.21.0")
    assert gr.parse_t2t_stdout("Using libGenie.so version 1.21.0\n")[0] is None


# --- Genie on the HTP simulator ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def llm_greedy(contexts, tokenizer, device_bin, tmp_path_factory):
    """llm_runner's greedy ids of TEXT_PROMPTS on the same context binaries (the *_ctx.onnx wrappers)."""
    tmp = tmp_path_factory.mktemp("llm")
    prompts = [tokenizer.encode(p).ids for p in TEXT_PROMPTS]
    (tmp / "prompts.json").write_text(json.dumps(prompts))
    proc = subprocess.run([sys.executable, str(device_bin / "llm_runner.py"), "generate", "--prefill",
                           str(contexts[0].model), "--decode", str(contexts[1].model), "--prompts",
                           str(tmp / "prompts.json"), "--max_new", str(MAX_NEW), "--runtime", "htp", "--htp_arch", "75",
                           "--soc_model", "57", "--output_dir", str(tmp / "out")], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp / "out" / "result.json").read_text())
    return prompts, [p["generated_ids"] for p in result["prompts"]]


@pytest.fixture(scope="session")
def dialog_result(bundle, device_bin, llm_greedy, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dialog")
    prompts = TEXT_PROMPTS + [llm_greedy[0][0]]  # two text prompts, then the first as token ids
    rc, result, stderr = run_genie(device_bin, "dialog", "--config", str(bundle), "--prompts",
                                   write_prompts(tmp / "prompts.json", prompts), "--max_new", str(MAX_NEW),
                                   "--output_dir", str(tmp / "out"))
    assert rc == 0, stderr
    return result


def test_dialog_equals_llm_runner_greedy_on_the_same_binaries(dialog_result, llm_greedy, tokenizer):
    prompt_ids, greedy = llm_greedy
    rows = dialog_result["prompts"]
    assert [r["prompt_ids"] for r in rows[:2]] == prompt_ids  # Genie's tokenizer encodes as tokenizers does
    assert all(len(g) == MAX_NEW for g in greedy)
    assert rows[2]["generated_ids"] == greedy[0]  # token for token (GenieDialog_tokenQuery)
    for row, ids in zip(rows[:2], greedy):
        assert row["text"] == tokenizer.decode(ids) and row["text"]  # the text queries' streamed text
        assert row["num_generated_tokens"] == MAX_NEW


def test_dialog_reports_genie_kpis(dialog_result):
    r = dialog_result
    assert r["error"] is None and r["genie_api_version"].startswith("1.") and r["context_length"] == CFG.context
    assert r["init_time_ms"] > 0 and r["init_wall_ms"] > 0 and r["peak_rss_mb"] > 0
    for row in r["prompts"]:
        for key in ("time_to_first_token_ms", "prompt_tokens_per_s", "tokens_per_s", "token_generation_time_ms"):
            assert row[key] > 0, key
        assert row["num_prompt_tokens"] == len(row["prompt_ids"] or row["prompt"])
        assert row["status_name"] == "GENIE_STATUS_SUCCESS" and row["profile"]["type"].startswith("GenieDialog_")
        assert row["profile"]["time-to-first-token"]["unit"] == "us"


def test_dialog_through_genie_t2t_run(bundle, device_bin, dialog_result, tmp_path):
    rc, result, stderr = run_genie(device_bin, "dialog", "--config", str(bundle), "--prompts",
                                   write_prompts(tmp_path / "p.json", TEXT_PROMPTS), "--max_new", str(MAX_NEW),
                                   "--output_dir", str(tmp_path / "out"), "--t2t_run", str(device_bin / "genie-t2t-run"))
    assert rc == 0, stderr
    assert result["t2t_version"] == dialog_result["genie_api_version"] and result["init_time_ms"] > 0
    assert [r["text"] for r in result["prompts"]] == [r["text"] for r in dialog_result["prompts"][:2]]
    for row in result["prompts"]:
        assert row["num_generated_tokens"] == MAX_NEW and row["time_to_first_token_ms"] > 0 and row["tokens_per_s"] > 0
    assert json.loads((tmp_path / "out" / "t2t" / "genie_config_0.json").read_text())["dialog"]["max-num-tokens"] == MAX_NEW


def test_a_dialog_past_its_budget_stops_before_a_prompt_and_reports_the_rest(bundle, device_bin, dialog_result,
                                                                            tmp_path):
    for t2t in ([], ["--t2t_run", str(device_bin / "genie-t2t-run")]):
        rc, result, stderr = run_genie(device_bin, "dialog", "--config", str(bundle), "--prompts",
                                       write_prompts(tmp_path / "p.json", TEXT_PROMPTS), "--max_new", str(MAX_NEW),
                                       "--output_dir", str(tmp_path / f"out{len(t2t)}"), "--budget_s", "0.001", *t2t)
        assert rc == 0, stderr
        # the first prompt always runs; the second would pass the budget, so it is left for another command
        assert len(result["prompts"]) == 1 and result["remaining"] == {"prompts": len(TEXT_PROMPTS) - 1}
        assert result["prompts"][0]["text"] == dialog_result["prompts"][0]["text"]
    assert dialog_result["remaining"] == {"prompts": 0}


def test_stress_fills_the_context_without_errors_or_unbounded_memory(bundle, device_bin, tokenizer, tmp_path):
    prompts = [TEXT_PROMPTS[1], "The", TEXT_PROMPTS[0]]
    rc, result, stderr = run_genie(device_bin, "stress", "--config", str(bundle), "--prompts",
                                   write_prompts(tmp_path / "p.json", prompts), "--rounds", "2", "--concurrent", "2",
                                   "--output_dir", str(tmp_path / "out"))
    assert rc == 0, stderr
    assert result["errors"] == 0 and result["error_names"] == {} and result["dialogs"] == 4
    assert result["prompt_order"] == [1, 2, 0]  # increasing token length
    queries = result["queries"]
    assert len(queries) == 2 * 2 * 3 and {q["worker"] for q in queries} == {0, 1}
    for q in queries:
        assert q["num_prompt_tokens"] + q["num_generated_tokens"] == CFG.context  # to the full context
        assert q["end_s"] > q["start_s"] and q["tokens_per_s"] > 0
    overlap = [q for q in queries if q["worker"] == 0 and q["round"] == 0]
    other = [q for q in queries if q["worker"] == 1 and q["round"] == 0]
    assert min(q["end_s"] for q in overlap) > min(q["start_s"] for q in other)  # the two dialogs ran at once
    for k in range(3):  # concurrent dialogs decode as one alone: the same greedy text in every worker and round
        texts = {q["text"] for q in queries if q["prompt_index"] == k}
        assert len(texts) == 1 and texts.pop()
    assert len(result["rss_after_round_mb"]) == 2 and len(result["rss_series"]) >= 2
    assert result["rss_release"] == "malloc_trim(0)"  # glibc: the allocator's free pages returned before sampling
    assert result["rss_growth_mb"] < 0.5 * result["rss_start_mb"]
    assert [p["t_s"] for p in result["token_rate_series"]] == sorted(p["t_s"] for p in result["token_rate_series"])


def test_stress_prompts_reach_the_context_through_the_prompt():
    ids = np.arange(100, 150)  # shorter than the prompts together: cut again from its start
    prompts = stress_prompts(ids, 128, 32, 8)
    assert [len(p) for p in prompts] == [8, 52, 97]  # the longest as long as Genie takes (context - AR + 1)
    assert prompts[0] == list(range(100, 108)) and prompts[1][:2] == [108, 109] and prompts[1][42] == 100
    assert [len(p) for p in stress_prompts(ids, 128, 1, 8)] == [8, 64, 120]  # it and its 8 new tokens fill it
    assert [len(p) for p in stress_prompts(ids, 16, 4, 12, count=4)] == [4, 4, 4, 4]  # 8 would leave no room
    with pytest.raises(ConfigError, match=r"--genie-stress-new-tokens 128: .* \(at most 127 new tokens\)"):
        stress_prompts(ids, 128, 32, 128)


def test_the_stress_time_limit_is_its_work_at_genie_runtimes_pace():
    from harness.llm.genie_steps import STRESS_TIME_MARGIN, stress_time_limit_s

    prompts = [[1] * 8, [1] * 52, [1] * 97]
    # SmolLM2 on the HTP simulator (genie_runtime, 2026-12-07): about 2.5 prompt tokens/s, 0.15 tokens/s at worst
    pace = {"prompt_tokens_per_s": 2.5, "tokens_per_s_min": 0.15, "init_time_ms": 20000.0}
    round_s = 157 / 2.5 + (8 + 8 + 31) / 0.15  # the longest prompt generates to the context's end
    limit = stress_time_limit_s(pace, prompts, 8, 128, rounds=2, concurrent=2, floor_s=900.0)
    assert limit == pytest.approx(STRESS_TIME_MARGIN * 2 * (2 * round_s + 20.0))  # about 75 minutes, not 40
    fast = {"prompt_tokens_per_s": 5000.0, "tokens_per_s_min": 800.0}  # a phone: the floor holds
    assert stress_time_limit_s(fast, prompts, 8, 128, 2, 2, 900.0) == 900.0
    assert stress_time_limit_s({}, prompts, 8, 128, 2, 2, 900.0) == 900.0  # no pace measured: the floor


def test_stress_generates_the_new_tokens_and_the_longest_prompt_fills_the_context(bundle, device_bin, tokenizer,
                                                                                  tmp_path):
    ids = np.asarray(tokenizer.encode(" ".join(TEXT_PROMPTS)).ids)
    prompts = stress_prompts(ids, CFG.context, CFG.prefill_ar, 3)
    assert [len(p) for p in prompts] == [8, 28, CFG.context - CFG.prefill_ar + 1]
    rc, result, stderr = run_genie(device_bin, "stress", "--config", str(bundle), "--prompts",
                                   write_prompts(tmp_path / "p.json", prompts[::-1]), "--rounds", "1",
                                   "--concurrent", "1", "--max_new", "3", "--output_dir", str(tmp_path / "out"))
    assert rc == 0, stderr
    queries = result["queries"]
    assert result["errors"] == 0 and [q["num_prompt_tokens"] for q in queries] == [len(p) for p in prompts]
    assert [q["max_new"] for q in queries] == [q["num_generated_tokens"] for q in queries] == [3, 3, 15]
    assert queries[-1]["num_prompt_tokens"] + queries[-1]["num_generated_tokens"] == CFG.context
    # one token past what Genie takes: GENIE_STATUS_WARNING_CONTEXT_EXCEEDED with nothing generated, a failed query
    rc, result, stderr = run_genie(device_bin, "stress", "--config", str(bundle), "--prompts",
                                   write_prompts(tmp_path / "p2.json", [prompts[-1] + [5]]), "--rounds", "1",
                                   "--concurrent", "1", "--max_new", "3", "--output_dir", str(tmp_path / "out2"))
    assert rc == 3 and result["errors"] == 1, stderr
    assert result["error_names"] == {"GENIE_STATUS_WARNING_CONTEXT_EXCEEDED": 1}
    assert "prompt 0 of 50 tokens: GENIE_STATUS_WARNING_CONTEXT_EXCEEDED with nothing generated" in result["error"]
    # a prompt that leaves no room at all is refused before Genie runs
    rc, result, _ = run_genie(device_bin, "stress", "--config", str(bundle), "--prompts",
                              write_prompts(tmp_path / "p3.json", [[5] * CFG.context]), "--max_new", "3",
                              "--output_dir", str(tmp_path / "out3"))
    assert rc == 2 and f"prompt 0 of {CFG.context} token ids is {CFG.context} tokens; the context holds" in result["error"]


# --- bad input ---------------------------------------------------------------------------------------------


def _copy_bundle(bundle: Path, dst: Path) -> Path:
    shutil.copytree(bundle.parent, dst)
    return dst / bundle.name


def test_missing_context_binary_is_named(bundle, device_bin, tmp_path):
    config = _copy_bundle(bundle, tmp_path / "b")
    missing = json.loads(config.read_text())["dialog"]["engine"]["model"]["binary"]["ctx-bins"][1]
    (config.parent / missing).unlink()
    rc, result, _ = run_genie(device_bin, "dialog", "--config", str(config), "--prompts",
                              write_prompts(tmp_path / "p.json", ["x"]), "--max_new", "2", "--output_dir",
                              str(tmp_path / "out"))
    assert rc == 2 and str(config.parent / missing) in result["error"] and "is missing" in result["error"]


def test_corrupt_tokenizer_is_named(bundle, device_bin, tmp_path):
    config = _copy_bundle(bundle, tmp_path / "b")
    tok = config.parent / TOKENIZER_FILE
    tok.write_text(tok.read_text()[:1000])
    rc, result, _ = run_genie(device_bin, "dialog", "--config", str(config), "--prompts",
                              write_prompts(tmp_path / "p.json", ["x"]), "--max_new", "2", "--output_dir",
                              str(tmp_path / "out"))
    assert rc == 2 and f"tokenizer {tok}: not valid JSON" in result["error"]
    tok.write_text(json.dumps({"version": "1.0"}))
    rc, result, _ = run_genie(device_bin, "dialog", "--config", str(config), "--prompts",
                              write_prompts(tmp_path / "p.json", ["x"]), "--max_new", "2", "--output_dir",
                              str(tmp_path / "out"))
    assert rc == 2 and "not a Hugging Face tokenizer.json" in result["error"]


def test_prompt_longer_than_the_context_is_refused(bundle, device_bin, tmp_path):
    long = " ".join(["statement"] * CFG.context)
    rc, result, _ = run_genie(device_bin, "dialog", "--config", str(bundle), "--prompts",
                              write_prompts(tmp_path / "p.json", ["ok", long]), "--max_new", "2", "--output_dir",
                              str(tmp_path / "out"))
    assert rc == 2 and "prompt 1 'statement statement" in result["error"]
    assert f"the context holds {CFG.context}, so a prompt may have at most {CFG.context - 1} tokens" in result["error"]


def test_genie_schema_error_is_named(bundle, device_bin, tmp_path):
    config = _copy_bundle(bundle, tmp_path / "b")
    data = json.loads(config.read_text())
    data["dialog"]["context"]["colour"] = 1
    config.write_text(json.dumps(data))
    rc, result, _ = run_genie(device_bin, "dialog", "--config", str(config), "--prompts",
                              write_prompts(tmp_path / "p.json", ["x"]), "--max_new", "2", "--output_dir",
                              str(tmp_path / "out"))
    assert rc == 2 and result["error_name"] == "GENIE_STATUS_ERROR_JSON_SCHEMA" and result["status"] == -8
    assert "GenieDialogConfig_createFromJson returned GENIE_STATUS_ERROR_JSON_SCHEMA (-8)" in result["error"]


def test_injected_genie_error_shows_its_name(bundle, device_bin, tmp_path):
    rc, result, stderr = run_genie(device_bin, "dialog", "--config", str(bundle), "--prompts",
                                   write_prompts(tmp_path / "p.json", ["x"]), "--max_new", "2", "--output_dir",
                                   str(tmp_path / "out"), env={gr.INJECT_ENV: "GenieDialog_query=-6"})
    assert rc == 3 and result["error_name"] == "GENIE_STATUS_ERROR_QUERY_FAILED"
    assert "GENIE_STATUS_ERROR_QUERY_FAILED (-6): the dialog query failed" in result["error"]
    assert "genie_runner: GenieDialog_query" in stderr
