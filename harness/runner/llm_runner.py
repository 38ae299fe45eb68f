#!/usr/bin/env python3
"""Device-side LLM runner: Genie's KV-cache bookkeeping over onnxruntime sessions of a prefill/decode pair.

Pushed to the device's bin/ beside device_runner.py (whose session making it reuses) and run with the
device's python; needs only numpy and onnxruntime (plus onnxruntime-qnn for the `htp` runtime).

Graphs:  the static pair harness.llm.export writes (the names are repeated here: the harness is not on
         devices): inputs input_ids [1, AR] int32, attention_mask [1, 1, AR, CL] float32 (additive, 0 attend,
         -1000 masked; CL-AR past columns, then AR new), position_ids [1, AR] int32, past_key_{l}_in
         [H, 1, Dh, CL-AR], past_value_{l}_in [H, 1, CL-AR, Dh]; outputs logits [1, AR, V] and the new
         entries past_key_{l}_out [H, 1, Dh, AR], past_value_{l}_out [H, 1, AR, Dh]. Float models, QDQ
         models and EP-context models (*_ctx.onnx) alike.
KV loop: one cache of CL - 1 past slots per layer (the decode graph's past; the prefill graph is fed its
         first CL-AR), filled from slot 0, empty slots masked. A prompt is fed in chunks of AR tokens through
         the prefill graph (the last chunk padded, its padding masked and its outputs dropped; where fewer
         than AR slots are left the decode graph takes the remaining tokens one at a time), then tokens are
         generated greedily (argmax, first maximum) one at a time through the decode graph, until --max_new
         tokens, the stop id (kept as the last token) or a full context (prompt + generated = CL tokens).
generate --prefill P --decode D --prompts prompts.json (a JSON list of token-id lists) --max_new N
         --runtime cpu|htp [--htp_arch A --soc_model S] [--stop_id ID] --output_dir OUT: OUT/result.json
         holds per prompt the generated ids, stop reason, time to first token (prefill plus first argmax),
         each decode step's time, prompt tokens/s and generated tokens/s (decode steps / their time); each
         session's creation time, provider options and real node placement; peak_rss_mb.
nll      --prefill P --windows windows.npy ([N, W] int32 token windows, 2 <= W <= AR) --runtime ...: one
         prefill call per window with an empty past; per window the summed negative log-likelihood (nats) of
         tokens 1..W-1 given the earlier ones and their count, the totals and the perplexity, in result.json.
         With --sequences seqs.json (a JSON list of {"ids": [...], "from": k}, 1 <= k < len(ids) + 1) also each
         sequence teacher-forced through the prefill graph (the cache's last slots by the decode graph, if given
         with --decode): the argmax token after each of positions k-1 .. len-1 ("top1", predicting ids[k:] and one
         token more). The sequences' common leading tokens are fed once and their cache reused.
Exit codes (as device_runner.py): 0 ok, 2 bad input or model, 3 runtime failure; result.json is written in
         every case, its `error` naming what went wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
import traceback

try:  # imported as harness.runner.llm_runner on the host
    from . import device_runner
except ImportError:  # run as a script from the device's bin/, beside device_runner.py
    import device_runner

RUNNER_VERSION = "3"  # 2: nll --sequences (teacher-forced argmax tokens); 3: nll --budget_s (work left is reported)
RESULT_FILE = "result.json"
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
MASK_ATTEND = 0.0
MASK_BLOCKED = -1000.0
KV_NAME = re.compile(r"^past_(key|value)_(\d+)_(in|out)$")
RunnerFailure = device_runner.RunnerFailure


def past_key_in(layer):
    return "past_key_%d_in" % layer


def past_value_in(layer):
    return "past_value_%d_in" % layer


def past_key_out(layer):
    return "past_key_%d_out" % layer


def past_value_out(layer):
    return "past_value_%d_out" % layer


class Graph:
    """One graph's session and the static dims its inputs declare."""

    def __init__(self, session, label, npu=None):
        self.session, self.label, self.npu = session, label, npu
        inputs = {m.name: m for m in session.get_inputs()}
        for name in (INPUT_IDS, ATTENTION_MASK, POSITION_IDS, past_key_in(0), past_value_in(0)):
            if name not in inputs:
                raise RunnerFailure("%s graph: no input '%s' (inputs: %s); export it with harness.llm.export"
                                    % (label, name, ", ".join(sorted(inputs))))
        self.ar = int(inputs[INPUT_IDS].shape[1])
        self.context = int(inputs[ATTENTION_MASK].shape[3])
        self.past = self.context - self.ar
        self.layers = sum(1 for n in inputs if KV_NAME.match(n) and n.startswith("past_key_"))
        key = inputs[past_key_in(0)].shape
        self.heads, self.head_dim = int(key[0]), int(key[2])
        self.out_names = [o.name for o in session.get_outputs()]
        if LOGITS not in self.out_names:
            raise RunnerFailure("%s graph: no output '%s'" % (label, LOGITS))

    def run(self, feed):
        """Return ({output name: array}, seconds the call took on the device)."""
        outs, elapsed = device_runner.timed_run(self.session, self.out_names, feed, self.npu)
        return dict(zip(self.out_names, outs)), elapsed


class KvLoop:
    """Genie's KV bookkeeping over a prefill graph (AR-N) and an optional decode graph (AR-1)."""

    def __init__(self, np, prefill, decode=None):
        self.np, self.prefill_graph, self.decode_graph = np, prefill, decode
        graphs = [g for g in (prefill, decode) if g is not None]
        for g in graphs[1:]:
            dims = ("context", "layers", "heads", "head_dim")
            if any(getattr(g, d) != getattr(prefill, d) for d in dims):
                raise RunnerFailure("the prefill and decode graphs disagree: " + ", ".join(
                    "%s %s vs %s" % (d, getattr(prefill, d), getattr(g, d)) for d in dims))
        if decode is not None and decode.ar != 1:
            raise RunnerFailure("the decode graph takes %d tokens per call; it must take 1" % decode.ar)
        self.context = prefill.context
        self.slots = max(g.past for g in graphs)
        h, dh = prefill.heads, prefill.head_dim
        self.keys = [np.zeros((h, 1, dh, self.slots), np.float32) for _ in range(prefill.layers)]
        self.values = [np.zeros((h, 1, self.slots, dh), np.float32) for _ in range(prefill.layers)]
        self.n_past = 0
        self.call_s = []  # (graph label, seconds) of every call since the last reset

    def reset(self):
        """Empty the cache."""
        for k, v in zip(self.keys, self.values):
            k.fill(0.0)
            v.fill(0.0)
        self.n_past = 0
        self.call_s = []

    def _feed(self, graph, tokens):
        """Return the inputs for len(tokens) <= AR real tokens after the n_past cached ones (rest padded)."""
        np, ar, n, c = self.np, graph.ar, self.n_past, len(tokens)
        ids = np.zeros((1, ar), np.int32)
        ids[0, :c] = tokens
        mask = np.full((1, 1, ar, graph.context), MASK_BLOCKED, np.float32)
        mask[0, 0, :, :n] = MASK_ATTEND
        mask[0, 0, :, graph.past:] = np.where(np.tril(np.ones((ar, ar), bool)), MASK_ATTEND, MASK_BLOCKED)
        feed = {INPUT_IDS: ids, ATTENTION_MASK: mask,
                POSITION_IDS: (n + np.arange(ar, dtype=np.int32))[None, :]}
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            feed[past_key_in(layer)] = np.ascontiguousarray(k[..., :graph.past])
            feed[past_value_in(layer)] = np.ascontiguousarray(v[:, :, :graph.past, :])
        return feed

    def _call(self, graph, tokens):
        """Run graph on up to AR tokens, append their K/V to the cache; return their logits [len, V]."""
        c = len(tokens)
        if not 1 <= c <= graph.ar or self.n_past > graph.past:
            raise RunnerFailure("internal: %d tokens after %d cached do not fit the %s graph" % (
                c, self.n_past, graph.label), 3)
        outs, elapsed = graph.run(self._feed(graph, tokens))
        self.call_s.append((graph.label, elapsed))
        n = self.n_past
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            k[..., n:n + c] = outs[past_key_out(layer)][..., :c]
            v[:, :, n:n + c, :] = outs[past_value_out(layer)][:, :, :c, :]
        self.n_past = n + c
        logits = outs[LOGITS]
        return logits.reshape(graph.ar, logits.shape[-1])[:c]

    def prefill(self, tokens):
        """Feed tokens after the cached ones (AR-token prefill chunks while AR slots are left, then the decode
        graph one token at a time); return their logits [len(tokens), V]."""
        tokens = [int(t) for t in tokens]
        if self.n_past + len(tokens) > self.context:
            raise RunnerFailure("%d tokens after %d cached exceed the context length %d" % (
                len(tokens), self.n_past, self.context))
        rows, i = [], 0
        while i < len(tokens):
            room = min(self.prefill_graph.ar, self.slots - self.n_past)  # the chunk's K/V must fit the cache
            if self.n_past <= self.prefill_graph.past and room >= 1:
                chunk = tokens[i:i + room]
                rows.append(self._call(self.prefill_graph, chunk))
            elif self.decode_graph is not None:
                chunk = tokens[i:i + 1]
                rows.append(self._call(self.decode_graph, chunk))
            else:
                raise RunnerFailure("%d cached tokens leave fewer than AR = %d slots and there is no decode graph"
                                    % (self.n_past, self.prefill_graph.ar))
            i += len(chunk)
        return self.np.concatenate(rows, axis=0)

    def decode(self, token):
        """Feed one token through the decode graph; return its logits [V]."""
        if self.decode_graph is None:
            raise RunnerFailure("decoding needs the decode graph (--decode)")
        if self.n_past >= self.context:
            raise RunnerFailure("the context of %d tokens is full" % self.context)
        return self._call(self.decode_graph, [int(token)])[0]

    def generate(self, prompt, max_new, stop_id=None):
        """Return {ids, stop_reason, timings} of greedy generation after the prompt (the cache is reset)."""
        if not prompt:
            raise RunnerFailure("an empty prompt: give at least one token")
        if len(prompt) >= self.context:
            raise RunnerFailure("a prompt of %d tokens does not fit the context length %d with room to generate "
                                "(at most %d prompt tokens)" % (len(prompt), self.context, self.context - 1))
        clock = time.perf_counter
        self.reset()
        t0 = clock()
        token = int(self.np.argmax(self.prefill(prompt)[-1]))
        ttft_s = clock() - t0
        ids, decode_s = [token], []
        reason = "stop_id" if token == stop_id else None
        while reason is None:
            if len(ids) >= max_new:
                reason = "max_new"
            elif len(prompt) + len(ids) >= self.context:
                reason = "context_full"
            else:
                t = clock()
                token = int(self.np.argmax(self.decode(token)))
                decode_s.append(clock() - t)
                ids.append(token)
                reason = "stop_id" if token == stop_id else None
        return {"prompt_tokens": len(prompt), "generated_ids": ids, "stop_reason": reason,
                "time_to_first_token_s": ttft_s, "decode_token_s": decode_s,
                "prompt_tokens_per_s": len(prompt) / ttft_s if ttft_s > 0 else None,
                "tokens_per_s": len(decode_s) / sum(decode_s) if decode_s and sum(decode_s) > 0 else None,
                "calls": [{"graph": g, "s": s} for g, s in self.call_s]}

    def snapshot(self):
        """Return the cache's state (copies) for restore()."""
        return self.n_past, [k.copy() for k in self.keys], [v.copy() for v in self.values]

    def restore(self, state):
        """Put back a snapshot()'s cache."""
        self.n_past = state[0]
        for dst, src in zip(self.keys + self.values, state[1] + state[2]):
            dst[...] = src
        self.call_s = []

    def forced_top1(self, sequences, out_of_time=lambda item_s: False):
        """Return per {"ids", "from"} sequence the argmax tokens after positions from-1 .. len-1, each sequence
        fed after the cache of the sequences' common leading tokens (computed once, never past any from-1);
        stops before a sequence when out_of_time(the longest one's seconds so far) says so (after one at least),
        so that fewer sequences than given may be answered."""
        np = self.np
        common = os.path.commonprefix([s["ids"] for s in sequences])  # element-wise: lists too
        shared = min(len(common), min(s["from"] for s in sequences) - 1)
        self.reset()
        if shared > 0:
            self.prefill(common[:shared])
        state = self.snapshot()
        out = []
        for s in sequences:
            if out and out_of_time(max(o["s"] for o in out)):
                break
            self.restore(state)
            start = time.perf_counter()
            logits = self.prefill(s["ids"][shared:])[s["from"] - 1 - shared:]
            out.append({"top1": [int(k) for k in np.argmax(logits, axis=-1)], "s": time.perf_counter() - start})
        return {"shared_tokens": shared, "sequences": out}

    def window_nll(self, window):
        """Return (summed NLL in nats of tokens 1..W-1 given the earlier ones, W-1) from one prefill call."""
        np = self.np
        if not 2 <= len(window) <= self.prefill_graph.ar:
            raise RunnerFailure("a window of %d tokens: windows need 2..AR = %d tokens"
                                % (len(window), self.prefill_graph.ar))
        self.reset()
        logits = self._call(self.prefill_graph, [int(t) for t in window]).astype(np.float64)[:-1]
        logits = logits - logits.max(axis=-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        targets = np.asarray(window[1:], dtype=np.int64)
        return float(-logp[np.arange(len(targets)), targets].sum()), int(len(targets))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefill", required=True, help="the prefill graph (AR-N)")
    common.add_argument("--runtime", choices=["cpu", "htp"], required=True)
    common.add_argument("--output_dir", required=True)
    common.add_argument("--htp_arch", type=int)
    common.add_argument("--soc_model", type=int)
    common.add_argument("--allow_cpu_fallback", action="store_true",
                        help="let nodes the HTP cannot run fall back to the CPU EP (off by default)")
    common.add_argument("--intra_op_threads", type=int, default=0)
    gen = sub.add_parser("generate", parents=[common], help="greedy generation from token-id prompts")
    gen.add_argument("--decode", required=True, help="the decode graph (AR-1)")
    gen.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    gen.add_argument("--max_new", type=int, required=True, help="at most this many generated tokens per prompt")
    gen.add_argument("--stop_id", type=int, help="stop after generating this token id")
    gen.add_argument("--warmup", type=int, default=0, help="untimed generations of the first prompt first")
    nll = sub.add_parser("nll", parents=[common], help="negative log-likelihood of token windows")
    nll.add_argument("--windows", required=True, help=".npy of [N, W] int32 token windows, 2 <= W <= AR")
    nll.add_argument("--sequences", help='JSON list of {"ids": [...], "from": k}: teacher-forced argmax tokens')
    nll.add_argument("--decode", help="the decode graph, for sequences past the prefill graph's cache")
    nll.add_argument("--budget_s", type=float, help="stop before an item that would likely end past this many "
                     "seconds from the start, and report what is left (`remaining`)")
    args = p.parse_args(argv)
    if args.command == "generate" and args.max_new < 1:
        p.error("--max_new must be at least 1")
    return args


def _session_args(args, model):
    """Return the namespace device_runner.make_session reads, for one model."""
    return argparse.Namespace(model=model, runtime=args.runtime, htp_arch=args.htp_arch, soc_model=args.soc_model,
                              allow_cpu_fallback=args.allow_cpu_fallback, profiling_level="off",
                              profiling_file=None, output_dir=args.output_dir,
                              intra_op_threads=args.intra_op_threads)


def open_graph(ort, args, model, label, npu, sessions):
    """Return the Graph of one model; record its session's creation time, options and placement in sessions."""
    if not os.path.isfile(model):
        raise RunnerFailure("%s graph not found: %s" % (label, model))
    info = {"model": model, "cpu_fallback_disabled": args.runtime == "htp" and not args.allow_cpu_fallback}
    sargs = _session_args(args, model)
    device_runner.check_context_target(sargs, info)
    session = device_runner.make_session(ort, sargs, info, model=model)
    info["placement"] = device_runner.placement(session)
    by_ep = {}
    for row in info["placement"]:
        by_ep[row["ep"]] = by_ep.get(row["ep"], 0) + 1
    info["nodes_by_ep"] = by_ep
    sessions[label] = info
    return Graph(session, label, npu)


def _load_prompts(path, vocab):
    """Return the prompts (lists of ints in [0, vocab)) of a JSON file."""
    try:
        with open(path) as f:
            prompts = json.load(f)
    except (OSError, ValueError) as e:
        raise RunnerFailure("prompts %s: %s" % (path, e))
    if not isinstance(prompts, list) or not all(isinstance(p, list) for p in prompts):
        raise RunnerFailure("prompts %s: expected a JSON list of token-id lists" % path)
    return _load_prompts_checked(path, prompts, vocab)


def _load_prompts_checked(path, prompts, vocab):
    """Return prompts after checking every token is an id in [0, vocab)."""
    for k, prompt in enumerate(prompts):
        bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise RunnerFailure("prompts %s: prompt %d holds %r, not token ids in [0, %d)" % (path, k, bad[0], vocab))
    return prompts


def _vocab(graph):
    """Return V from the logits output's last dim."""
    for o in graph.session.get_outputs():
        if o.name == LOGITS:
            return int(o.shape[-1])
    return 0


def run_generate(np, ort, args, npu, report):
    """The generate command: fills report's sessions, prompts and dims."""
    sessions = report["sessions"]
    prefill = open_graph(ort, args, args.prefill, "prefill", npu, sessions)
    decode = open_graph(ort, args, args.decode, "decode", npu, sessions)
    loop = KvLoop(np, prefill, decode)
    vocab = _vocab(prefill)
    report["dims"] = {"context_length": loop.context, "prefill_ar": prefill.ar, "layers": prefill.layers,
                      "heads": prefill.heads, "head_dim": prefill.head_dim, "vocab": vocab, "cache_slots": loop.slots}
    prompts = _load_prompts(args.prompts, vocab)
    for _ in range(args.warmup if prompts else 0):
        loop.generate(prompts[0], min(args.max_new, 2), args.stop_id)
    report["prompts"] = [loop.generate(prompt, args.max_new, args.stop_id) for prompt in prompts]


def _load_sequences(path, vocab, context):
    """Return the teacher-forced sequences of a JSON file ({"ids": token ids, "from": k} each)."""
    try:
        with open(path) as f:
            sequences = json.load(f)
    except (OSError, ValueError) as e:
        raise RunnerFailure("sequences %s: %s" % (path, e))
    if not isinstance(sequences, list) or not sequences or not all(
            isinstance(s, dict) and isinstance(s.get("ids"), list) and isinstance(s.get("from"), int) for s in sequences):
        raise RunnerFailure('sequences %s: expected a non-empty JSON list of {"ids": [...], "from": k}' % path)
    _load_prompts_checked(path, [s["ids"] for s in sequences], vocab)
    for k, s in enumerate(sequences):
        if not 1 <= s["from"] <= len(s["ids"]) < context:
            raise RunnerFailure("sequences %s: sequence %d has %d tokens and from %d: need 1 <= from <= tokens < "
                                "the context length %d" % (path, k, len(s["ids"]), s["from"], context))
    return sequences


def run_nll(np, ort, args, npu, report, started=None):
    """The nll command: fills report's sessions, windows and totals (and with --sequences, their top1). With
    --budget_s, it stops before a window or sequence that would likely end past that many seconds from
    started (twice the longest item so far; one item at least) and reports how many of each are left in
    `remaining`, for the caller to send in another command."""
    prefill = open_graph(ort, args, args.prefill, "prefill", npu, report["sessions"])
    decode = open_graph(ort, args, args.decode, "decode", npu, report["sessions"]) if args.decode else None
    loop = KvLoop(np, prefill, decode)
    try:
        windows = np.load(args.windows)
    except (OSError, ValueError) as e:
        raise RunnerFailure("windows %s: %s" % (args.windows, e))
    vocab = _vocab(prefill)
    if windows.ndim != 2 or windows.dtype.kind not in "iu" or (windows.size and not (
            0 <= windows.min() and windows.max() < vocab)):
        raise RunnerFailure("windows %s: expected [N, W] integer token ids in [0, %d), got %s %s"
                            % (args.windows, vocab, windows.dtype, list(windows.shape)))
    started = time.perf_counter() if started is None else started

    def out_of_time(item_s):
        return device_runner.past_budget(started, args.budget_s, item_s)

    rows, total, count = [], 0.0, 0
    for window in windows.tolist():
        if rows and out_of_time(max(r["s"] for r in rows)):
            break
        t = time.perf_counter()
        nll, n = loop.window_nll(window)
        rows.append({"nll": nll, "count": n, "s": time.perf_counter() - t})
        total, count = total + nll, count + n
    report["dims"] = {"context_length": loop.context, "prefill_ar": prefill.ar, "vocab": vocab}
    report["windows"] = rows
    report["nll_sum"], report["token_count"] = total, count
    report["perplexity"] = math.exp(total / count) if count else None
    sequences = _load_sequences(args.sequences, vocab, loop.context) if args.sequences else []
    left = len(windows) - len(rows)
    if sequences:  # after windows, only when the budget has room for one more item as long as the longest
        full = left or (rows and out_of_time(max(r["s"] for r in rows)))
        report["forced"] = {"shared_tokens": 0, "sequences": []} if full else loop.forced_top1(sequences, out_of_time)
    report["remaining"] = {"windows": left, "sequences": len(sequences) - len((report.get("forced") or
                                                                                {}).get("sequences", []))}


def main(argv=None):
    started = time.perf_counter()  # --budget_s counts from here: the sessions' creation is part of the command
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.output_dir, exist_ok=True)
    report = {"runner_version": RUNNER_VERSION, "command": args.command, "runtime": args.runtime,
              "prefill": args.prefill, "decode": getattr(args, "decode", None), "error": None,
              "machine": platform.machine(), "system": platform.system(), "sessions": {}}
    code = 0
    npu = device_runner.EmulatedNpu.from_env()
    try:
        import numpy as np
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        report["onnxruntime_version"] = ort.__version__
        if args.command == "generate":
            run_generate(np, ort, args, npu, report)
        else:
            run_nll(np, ort, args, npu, report, started)
    except RunnerFailure as e:
        report["error"], code = str(e), e.code
    except Exception as e:  # anything the runtime raised, in its own words
        report["error"], code = "%s: %s" % (type(e).__name__, e), 3
        report["traceback"] = traceback.format_exc()
    if npu is not None:
        npu.close()
    report["peak_rss_mb"] = device_runner.peak_rss_mb()
    path = os.path.join(args.output_dir, RESULT_FILE)
    with open(path + ".part", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".part", path)
    if report["error"]:
        print("llm_runner: %s" % report["error"], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
