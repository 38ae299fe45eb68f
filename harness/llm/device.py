"""Running a prefill/decode pair: on a device through its runner (llm_runner.py), and on the host in-process."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from harness.errors import RunnerError
from harness.host_sessions import host_session_options
from harness.runner import llm_runner
from harness.runner.base import push_model
from harness.runner.client import DeviceRunner

LLM_RUNNER = Path(llm_runner.__file__)


def _push_data(runner: DeviceRunner, name: str, payload: bytes) -> str:
    """Push bytes once per content as data/<digest>/<name>; return the remote path."""
    with tempfile.TemporaryDirectory(prefix="harness-llm-") as tmp:
        local = Path(tmp) / name
        local.write_bytes(payload)
        remote = f"data/llm-{hashlib.sha256(payload).hexdigest()[:16]}"
        runner.push_dir(Path(tmp), remote)
    return f"{remote}/{name}"


def _soc_args(runner: DeviceRunner, runtime: str) -> list[str]:
    soc = runner.transport.soc
    return ["--runtime", runtime, "--htp_arch", str(soc.htp_arch), "--soc_model", str(soc.soc_model)]


BUDGET_OF_TIMEOUT = 0.75  # an nll command plans to end within this share of the runner's command time limit


def device_nll(runner: DeviceRunner, prefill: Path, windows: np.ndarray, runtime: str = "htp",
               forced: list[tuple[list[int], int]] | None = None, decode: Path | None = None,
               budget_s: float | None = None) -> dict:
    """Return llm_runner's `nll` result for token windows [N, W] through the prefill graph on the device; with
    `forced` (token ids, from) sequences, also its `forced` result: each sequence's argmax tokens after positions
    from-1 onward, teacher-forced (the decode graph takes what the prefill graph's cache cannot).

    The work is paced, not guessed: each command gets budget_s (default BUDGET_OF_TIMEOUT of the runner's
    command time limit), the runner stops before an item that would likely pass it and reports what is left,
    and the rest goes in further commands (`commands` says how many ran): a 0.5B model on the HTP simulator
    (about 26 s per window) takes several, a phone one, and the time limit stays a hang detector."""
    budget = runner.timeout_s * BUDGET_OF_TIMEOUT if budget_s is None else budget_s
    forced = list(forced or [])

    def rest(so_far: dict | None) -> dict:
        w = len(so_far["windows"]) if so_far else 0
        f = len((so_far or {}).get("forced", {}).get("sequences", []))
        return _nll_command(runner, prefill, windows[w:], runtime, forced[f:], decode, budget)

    return run_paced(rest, lambda r: len(r["windows"]) + len(r.get("forced", {}).get("sequences", [])),
                     len(windows) + len(forced), _merge_nll, f"llm_runner nll on {Path(prefill).name}", runner)


def run_paced(rest: Callable[[dict | None], dict], done: Callable[[dict], int], total: int,
              join: Callable[[dict, dict], dict], what: str, runner: DeviceRunner) -> dict:
    """Return the joined result of paced commands (a runner's --budget_s): rest(the result so far, None at
    first) runs one command over what is left, join appends its result, until done(result) reaches total;
    `commands` says how many ran. Raises RunnerError when a command adds nothing."""
    result, commands = rest(None), 1
    while done(result) < total:
        before = done(result)
        result, commands = join(result, rest(result)), commands + 1
        if done(result) == before:
            raise RunnerError(f"{what} made no progress in a command ({total - before} of {total} items left)",
                              device=runner.transport.device_id)
    result["commands"] = commands
    return result


def _nll_command(runner: DeviceRunner, prefill: Path, windows: np.ndarray, runtime: str,
                 forced: list[tuple[list[int], int]], decode: Path | None, budget_s: float) -> dict:
    """Return one llm_runner nll command's result (its `remaining` says what it left for the next)."""
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(windows, dtype=np.int32))
    command = ["nll", "--prefill", push_model(runner.transport, prefill),
               "--windows", _push_data(runner, "windows.npy", buffer.getvalue()), *_soc_args(runner, runtime),
               "--budget_s", f"{budget_s:.3f}"]
    if forced:
        payload = json.dumps([{"ids": list(ids), "from": start} for ids, start in forced]).encode()
        command += ["--sequences", _push_data(runner, "sequences.json", payload)]
        if decode is not None:
            command += ["--decode", push_model(runner.transport, decode)]
    return runner.run_tool(LLM_RUNNER, command)


def _merge_nll(merged: dict, part: dict) -> dict:
    """Return merged with a later command's windows and sequences appended (totals and perplexity redone)."""
    import math

    out = dict(merged, windows=merged["windows"] + part["windows"], remaining=part.get("remaining"))
    out["nll_sum"] = merged["nll_sum"] + part["nll_sum"]
    out["token_count"] = merged["token_count"] + part["token_count"]
    out["perplexity"] = math.exp(out["nll_sum"] / out["token_count"]) if out["token_count"] else None
    out["peak_rss_mb"] = max(merged.get("peak_rss_mb") or 0, part.get("peak_rss_mb") or 0) or None
    if part.get("forced", {}).get("sequences"):
        before = merged.get("forced") or {"shared_tokens": part["forced"]["shared_tokens"], "sequences": []}
        shared = part["forced"]["shared_tokens"] if not before["sequences"] else min(before["shared_tokens"],
                                                                                      part["forced"]["shared_tokens"])
        out["forced"] = {"shared_tokens": shared, "sequences": before["sequences"] + part["forced"]["sequences"]}
    return out


def device_generate(runner: DeviceRunner, prefill: Path, decode: Path, prompts: list[tuple[int, ...]],
                    max_new: int, runtime: str = "htp", stop_id: int | None = None) -> dict:
    """Return llm_runner's `generate` result: greedy tokens per prompt with Genie's KV loop on the device."""
    remote_prompts = _push_data(runner, "prompts.json", json.dumps([list(p) for p in prompts]).encode())
    command = ["generate", "--prefill", push_model(runner.transport, prefill),
               "--decode", push_model(runner.transport, decode), "--prompts", remote_prompts, "--max_new", str(max_new), *_soc_args(runner, runtime)]
    if stop_id is not None:
        command += ["--stop_id", str(stop_id)]
    return runner.run_tool(LLM_RUNNER, command)


def _host_graph(model: Path, label: str, emulate_qdq: bool) -> llm_runner.Graph:
    import onnxruntime as ort

    options = host_session_options()
    if emulate_qdq:  # keep every Q/DQ pair: the host's emulation of the HTP's quantized arithmetic
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise RunnerError(f"onnxruntime on the host cannot load the {label} graph {model}: "
                          f"{str(e).splitlines()[0]}") from None
    return llm_runner.Graph(session, label)


def host_nll(prefill: Path, windows: np.ndarray, emulate_qdq: bool = False) -> dict:
    """Return {nll_sum, token_count, perplexity, windows: [{nll, count}]} of windows [N, W] through the prefill
    graph on the host CPU (the device runner's `nll` result's form)."""
    loop = llm_runner.KvLoop(np, _host_graph(prefill, "prefill", emulate_qdq))
    rows = [dict(zip(("nll", "count"), loop.window_nll(window))) for window in np.asarray(windows).tolist()]
    total, count = sum(r["nll"] for r in rows), sum(r["count"] for r in rows)
    return {"nll_sum": total, "token_count": count, "perplexity": float(np.exp(total / count)), "windows": rows}


def host_forced_top1(pair_prefill: Path, pair_decode: Path, forced: list[tuple[list[int], int]]) -> list[list[int]]:
    """Return, per (ids, from) sequence, the quantized pair's argmax after each prefix ids[:from] .. ids on the host
    (its QDQ emulation; the device runner's `nll --sequences` top1, llm_runner.KvLoop.forced_top1)."""
    loop = llm_runner.KvLoop(np, _host_graph(pair_prefill, "prefill", True), _host_graph(pair_decode, "decode", True))
    result = loop.forced_top1([{"ids": list(ids), "from": start} for ids, start in forced])
    return [s["top1"] for s in result["sequences"]]


def matched_prefix(a: list[int], b: list[int]) -> int:
    """Return how many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class FloatJudge:
    """The float pair on the host, judging generated tokens teacher-forced: a token agrees with the float
    model's greedy choice when its float logit is within `margin` of the top one (the top two of a near-tie
    are both the float model's choice: rounding alone picks between them)."""

    def __init__(self, prefill: Path, decode: Path, margin: float) -> None:
        self.loop = llm_runner.KvLoop(np, _host_graph(prefill, "prefill", False), _host_graph(decode, "decode", False))
        self.margin = margin

    def generate(self, prompts: list[tuple[int, ...]], max_new: int, stop_id: int | None = None) -> list[dict]:
        """Return the float model's greedy generations (llm_runner's per-prompt records)."""
        return [self.loop.generate(list(p), max_new, stop_id) for p in prompts]

    def consistent_prefix(self, prompt: tuple[int, ...], generated: list[int],
                          forced: list[int] | None = None) -> int:
        """Return how many leading generated tokens the float model would have chosen (up to a near-tie), each
        judged after the generated tokens before it, or with `forced` after those (teacher-forced: `generated`
        are a model's choices after each prefix of `forced`)."""
        if not generated:
            return 0
        context = generated if forced is None else forced
        self.loop.reset()
        logits = self.loop.prefill([*prompt, *context[:len(generated) - 1]])[len(prompt) - 1:]
        n = 0
        for row, token in zip(logits, generated):
            if float(row.max() - row[token]) > self.margin:
                break
            n += 1
        return n
