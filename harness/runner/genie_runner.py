#!/usr/bin/env python3
"""Device-side Genie runner: Qualcomm's LLM runtime (libGenie.so) driven over its C API with ctypes.

Stdlib only (plus ctypes); pushed to the device's bin/ beside device_runner.py (whose RunnerFailure and
peak_rss_mb it reuses) and run with the device's python. It plays the part of `genie-t2t-run` (which no
pip wheel ships) and of the seed's `genie-to-qnn-stress.py`, and can drive the real `genie-t2t-run` of a
QAIRT SDK instead (--t2t_run).

Bundle:  a folder holding genie_config.json, the context binaries, tokenizer.json and
         htp_backend_ext_config.json, referenced by relative name (harness.llm.genie_config.write_bundle);
         the runner resolves the config's paths from that folder (it works with cwd = the folder, as Genie
         resolves relative paths from the cwd). Before Genie sees it the runner checks the bundle: each
         ctx-bin present, the tokenizer a tokenizer.json (JSON object with a "model"), the extensions file
         JSON; a failure is exit 2 naming the file and what was expected.
Library: --lib PATH, else $GENIE_LIB, else libGenie.so in the onnxruntime_qnn package folder (the pip wheel),
         else libGenie.so on the loader path. libGenie loads libQnnHtp.so by name, so the library's folder
         must be on LD_LIBRARY_PATH when the process starts (the loader reads it once): the runner re-executes
         itself with the folder prepended when it is missing (once; GENIE_RUNNER_REEXEC marks the child).
dialog   --config genie_config.json --prompts prompts.json --max_new N --output_dir OUT [--lib P] [--t2t_run P]
         One dialog, created once (init time recorded), then per prompt: reset, set max tokens, query,
         collect the text and Genie's profile event of that query. A prompt is a string (GenieDialog_query:
         text out; its token ids from Genie's own tokenizer in `prompt_ids`) or a list of token ids
         (GenieDialog_tokenQuery: ids out in `generated_ids`, and their text). A prompt that leaves no room
         to generate in the context is refused (exit 2) naming it and its token count. With --t2t_run PATH
         each prompt runs in a `genie-t2t-run -c CONFIG --prompt_file F --profile F` process (its real flags;
         the config gets "max-num-tokens" in a copy under OUT/t2t), from the bundle folder; its stdout
         ("[BEGIN]: text[END]") and profile file give the same result.json shape.
stress   --config ... --prompts ... [--rounds R] [--concurrent K] [--max_new N] [--mode threads|processes]
         --output_dir OUT: K workers at once (threads over separate GenieDialog handles in this process, or
         copies of this runner), each running R dialogs in sequence (create, every prompt in increasing
         token length with a reset before each and max_new = context - prompt tokens, or --max_new if
         smaller, but the longest prompt always generates to the context's end, so the KV cache's last slots
         are used: the harness passes a small --max_new with a longest prompt near the context; free).
         A prompt that leaves no room (context tokens or more) is refused as in dialog; a query Genie answers
         with a warning status and nothing generated (GENIE_STATUS_WARNING_CONTEXT_EXCEEDED: Genie 1.21 takes
         at most context - AR + 1 prompt tokens, AR the prefill graph's) is a failed query. Per query: worker,
         round, start/end on one clock, tokens, tokens/s, time to first token, the text (or ids), Genie status
         name. VmRSS sampled every --rss_interval_s. Processes by default: separate GenieDialog handles queried at once from threads of one
         process gave the same greedy output as one alone, but crashed libGenie 1.21 on the HTP simulator now and
         then (SIGSEGV, more often on a 4-layer model); processes isolate that, as a phone app holds one dialog.
         The workers meet after each round (every dialog freed) and the RSS is sampled there, after the C
         allocator has returned its free pages to the kernel (rss_release: malloc_trim, or bionic's mallopt
         M_PURGE): rss_start_mb after the first round, rss_end_mb after the last, rss_growth_mb = end - start
         (a leak grows with the rounds; the first round's own growth, allocator arenas of the worker threads,
         is not counted; freed memory the allocator keeps is not a leak).
result.json (OUT/result.json, written atomically in every case): runner_version, command, genie_api_version,
         genie_lib, config, error, error_name (the Genie status name when Genie failed, else None), status
         (the Genie status code), genie_log (Genie's error/warning log lines), peak_rss_mb;
         dialog: init_time_ms, init_wall_ms, context_length, prompts [{prompt, prompt_ids|None,
         generated_ids|None, text, num_prompt_tokens, num_generated_tokens, time_to_first_token_ms,
         prompt_tokens_per_s, tokens_per_s, token_generation_time_ms, query_wall_ms, status_name, profile}];
         stress: queries [{worker, round, prompt_index, prompt_tokens, max_new, start_s, end_s, num_prompt_tokens,
         num_generated_tokens, time_to_first_token_ms, prompt_tokens_per_s, tokens_per_s, token_generation_time_ms,
         text, generated_ids, status_name, error, error_name}], prompt_order, errors, error_names {name: count}, dialogs, rounds, concurrent, mode,
         rss_initial_mb, rss_warm_mb, rss_after_round_mb [per round], rss_start_mb, rss_end_mb, rss_growth_mb, rss_release,
         rss_peak_mb, rss_series [{t_s, rss_mb}],
         token_rate_series [{t_s, tokens_per_s, worker}].
Units:   Genie's profile gives times in us and rates in toks/sec (GenieProfile's units, stated per field
         in its JSON); result.json converts times to ms (`_ms`) and keeps rates as tokens per second.
Status:  every Genie_Status_t is reported by its GenieCommon.h name and meaning (STATUS below), never bare.
         GENIE_RUNNER_INJECT="GenieDialog_query=-6" makes the named call return that status without calling
         Genie (tests use it to check the translation).
Exit codes (as device_runner.py): 0 ok, 2 bad input (config, bundle, prompts), 3 runtime failure (Genie
         failed at run time, a stress query failed, genie-t2t-run failed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import threading
import time
import traceback

try:  # imported as harness.runner.genie_runner on the host
    from . import device_runner
except ImportError:  # run as a script from the device's bin/, beside device_runner.py
    import device_runner

RUNNER_VERSION = "3"  # 2: the RSS at the round barriers sampled after the allocator releases its free pages;
                      # 3: dialog --budget_s (the prompts left are reported)
RESULT_FILE = "result.json"
RunnerFailure = device_runner.RunnerFailure
REEXEC_ENV = "GENIE_RUNNER_REEXEC"
INJECT_ENV = "GENIE_RUNNER_INJECT"
LIB_ENV = "GENIE_LIB"
LIB_NAME = "libGenie.so"
T2T_TIMEOUT_S = 600.0

# Genie_Status_t, from GenieCommon.h (the API 1.13 header of the QAIRT examples; libGenie 1.21 returns the same).
STATUS = {
    0: ("GENIE_STATUS_SUCCESS", "the call succeeded"),
    1: ("GENIE_STATUS_WARNING_ABORTED", "the query was aborted (GenieDialog_signal ABORT)"),
    2: ("GENIE_STATUS_WARNING_BOUND_HANDLE", "the handle is still bound to another handle"),
    3: ("GENIE_STATUS_WARNING_PAUSED", "the query was paused (GenieDialog_signal PAUSE)"),
    4: ("GENIE_STATUS_WARNING_CONTEXT_EXCEEDED", "the context limit was exceeded: prompt plus generated tokens "
                                                 "reached the dialog's context size"),
    -1: ("GENIE_STATUS_ERROR_GENERAL", "a general error"),
    -2: ("GENIE_STATUS_ERROR_INVALID_ARGUMENT", "at least one argument is invalid"),
    -3: ("GENIE_STATUS_ERROR_MEM_ALLOC", "memory allocation failed"),
    -4: ("GENIE_STATUS_ERROR_INVALID_CONFIG", "at least one configuration option is invalid"),
    -5: ("GENIE_STATUS_ERROR_INVALID_HANDLE", "the handle is invalid"),
    -6: ("GENIE_STATUS_ERROR_QUERY_FAILED", "the dialog query failed"),
    -7: ("GENIE_STATUS_ERROR_JSON_FORMAT", "the JSON string is not valid JSON"),
    -8: ("GENIE_STATUS_ERROR_JSON_SCHEMA", "the JSON config breaks Genie's schema (a missing or unknown key)"),
    -9: ("GENIE_STATUS_ERROR_JSON_VALUE", "a JSON config value is invalid"),
    -10: ("GENIE_STATUS_ERROR_GENERATE_FAILED", "generation failed"),
    -11: ("GENIE_STATUS_ERROR_GET_HANDLE_FAILED", "getting a handle (sampler, tokenizer, engine) failed"),
    -12: ("GENIE_STATUS_ERROR_APPLY_CONFIG_FAILED", "applying a config failed"),
    -13: ("GENIE_STATUS_ERROR_SET_PARAMS_FAILED", "setting parameters failed"),
    -14: ("GENIE_STATUS_ERROR_BOUND_HANDLE", "the handle is bound to another handle and cannot be freed"),
}
BAD_INPUT_STATUSES = {-4, -7, -8, -9}  # the config's fault: exit 2
SUCCESS, CONTEXT_EXCEEDED = 0, 4
SENTENCE = {0: "COMPLETE", 1: "BEGIN", 2: "CONTINUE", 3: "END", 4: "ABORT", 5: "REWIND", 6: "RESUME"}
SENTENCE_COMPLETE = 0
LOG_LEVEL_WARN = 2


def status_name(code):
    """Return the GenieCommon.h name of a status code (or a name saying it is unknown)."""
    return STATUS.get(code, ("GENIE_STATUS_UNKNOWN_%d" % code, ""))[0]


def status_text(code):
    """Return 'NAME (code): meaning' for a status code."""
    name, meaning = STATUS.get(code, ("GENIE_STATUS_UNKNOWN_%d" % code, "a code GenieCommon.h does not define"))
    return "%s (%d): %s" % (name, code, meaning)


class GenieError(RunnerFailure):
    """A Genie call returned a failing status."""

    def __init__(self, call, status, log_lines=(), subject=""):
        self.call, self.status, self.name = call, status, status_name(status)
        errors = [line for line in log_lines if line.startswith("<E>")] or list(log_lines)
        detail = "; Genie said: " + " | ".join(errors[-3:]) if errors else ""
        super().__init__("%s%s returned %s%s" % (call, " (%s)" % subject if subject else "", status_text(status),
                                                  detail), 2 if status in BAD_INPUT_STATUSES else 3)


# --- the library ------------------------------------------------------------------------------------------

QueryCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)
TokenQueryCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int,
                                      ctypes.c_void_p)
AllocCallback = ctypes.CFUNCTYPE(None, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))
LogCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64,
                               ctypes.c_void_p)
_H = ctypes.c_void_p
_HP = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = {
    "Genie_getApiMajorVersion": (ctypes.c_uint32, []),
    "Genie_getApiMinorVersion": (ctypes.c_uint32, []),
    "Genie_getApiPatchVersion": (ctypes.c_uint32, []),
    "GenieLog_create": (ctypes.c_int32, [_H, LogCallback, ctypes.c_int, _HP]),
    "GenieLog_free": (ctypes.c_int32, [_H]),
    "GenieProfile_create": (ctypes.c_int32, [_H, _HP]),
    "GenieProfile_getJsonData": (ctypes.c_int32, [_H, AllocCallback, _HP]),
    "GenieProfile_free": (ctypes.c_int32, [_H]),
    "GenieDialogConfig_createFromJson": (ctypes.c_int32, [ctypes.c_char_p, _HP]),
    "GenieDialogConfig_bindProfiler": (ctypes.c_int32, [_H, _H]),
    "GenieDialogConfig_bindLogger": (ctypes.c_int32, [_H, _H]),
    "GenieDialogConfig_free": (ctypes.c_int32, [_H]),
    "GenieDialog_create": (ctypes.c_int32, [_H, _HP]),
    "GenieDialog_query": (ctypes.c_int32, [_H, ctypes.c_char_p, ctypes.c_int, QueryCallback, ctypes.c_void_p]),
    "GenieDialog_tokenQuery": (ctypes.c_int32, [_H, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int,
                                                TokenQueryCallback, ctypes.c_void_p]),
    "GenieDialog_reset": (ctypes.c_int32, [_H]),
    "GenieDialog_setMaxNumTokens": (ctypes.c_int32, [_H, ctypes.c_uint32]),
    "GenieDialog_getTokenizer": (ctypes.c_int32, [_H, _HP]),
    "GenieDialog_free": (ctypes.c_int32, [_H]),
    "GenieTokenizer_encode": (ctypes.c_int32, [_H, ctypes.c_char_p, AllocCallback, _HP, ctypes.POINTER(ctypes.c_uint32)]),
    "GenieTokenizer_decode": (ctypes.c_int32, [_H, ctypes.POINTER(ctypes.c_int32), ctypes.c_uint32, AllocCallback,
                                               _HP]),
}


def default_lib_path():
    """Return the libGenie.so to load: $GENIE_LIB, the onnxruntime_qnn wheel's, else the bare name."""
    if os.environ.get(LIB_ENV):
        return os.environ[LIB_ENV]
    try:
        import importlib.util
        spec = importlib.util.find_spec("onnxruntime_qnn")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        candidate = os.path.join(os.path.dirname(spec.origin), LIB_NAME)
        if os.path.isfile(candidate):
            return candidate
    return LIB_NAME


def ensure_library_path(lib_path, argv):
    """Re-execute this runner with lib_path's folder on LD_LIBRARY_PATH when it is missing (once)."""
    folder = os.path.dirname(os.path.abspath(lib_path)) if os.sep in lib_path else ""
    current = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if not folder or folder in current or os.environ.get(REEXEC_ENV) or platform.system() != "Linux":
        return
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join([folder] + current), **{REEXEC_ENV: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + list(argv), env)


class _Buffers:
    """Client memory for Genie's Genie_AllocCallback_t: each allocation kept alive until taken."""

    def __init__(self):
        self._bufs = []
        self.callback = AllocCallback(self._alloc)

    def _alloc(self, size, out):
        buf = ctypes.create_string_buffer(max(int(size), 1))
        self._bufs.append(buf)
        out[0] = ctypes.addressof(buf)

    def take(self):
        """Return the last allocation's bytes (and forget every allocation)."""
        buf = self._bufs[-1] if self._bufs else None
        self._bufs = []
        return buf


class Genie:
    """libGenie.so with typed signatures, a logger collecting warnings/errors, and status checking."""

    def __init__(self, path):
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise RunnerFailure("cannot load %s: %s (give --lib PATH to libGenie.so; its folder must hold "
                                "libQnnHtp.so and be on LD_LIBRARY_PATH)" % (path, e), 2) from None
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.inject = dict(item.split("=", 1) for item in os.environ.get(INJECT_ENV, "").split(",") if "=" in item)
        self.log_lines = []
        self._log_lock = threading.Lock()
        try:
            self._libc = ctypes.CDLL(None)
            self._libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
        except (OSError, AttributeError):
            self._libc = None
        self._log_callback = LogCallback(self._log)
        self.log = _H()
        if self.lib.GenieLog_create(None, self._log_callback, LOG_LEVEL_WARN, ctypes.byref(self.log)) != SUCCESS:
            self.log = _H()

    @property
    def version(self):
        lib = self.lib
        return "%d.%d.%d" % (lib.Genie_getApiMajorVersion(), lib.Genie_getApiMinorVersion(),
                             lib.Genie_getApiPatchVersion())

    def _log(self, handle, fmt, level, timestamp, args):
        text = fmt or b""
        if self._libc is not None and fmt:
            buf = ctypes.create_string_buffer(2048)
            try:
                self._libc.vsnprintf(buf, len(buf), fmt, args)
                text = buf.value
            except Exception:  # a va_list this platform passes differently: keep the format string
                pass
        with self._log_lock:
            self.log_lines.append(text.decode(errors="replace").strip())
            del self.log_lines[:-50]

    def call(self, name, *args, subject=""):
        """Call a Genie function; raise GenieError unless it returned SUCCESS (or CONTEXT_EXCEEDED, returned)."""
        if name in self.inject:
            status = int(self.inject[name])
        else:
            status = getattr(self.lib, name)(*args)
        if status not in (SUCCESS, CONTEXT_EXCEEDED):
            raise GenieError(name, status, list(self.log_lines), subject)
        return status

    def close(self):
        if self.log:
            self.lib.GenieLog_free(self.log)
            self.log = _H()


class Dialog:
    """One GenieDialog with its own config and profile handles."""

    def __init__(self, genie, config_text):
        self.genie, self.config, self.profile, self.handle = genie, _H(), _H(), _H()
        self.buffers = _Buffers()
        self._events_seen = 0
        try:
            genie.call("GenieDialogConfig_createFromJson", config_text.encode(), ctypes.byref(self.config))
            genie.call("GenieProfile_create", None, ctypes.byref(self.profile))
            genie.call("GenieDialogConfig_bindProfiler", self.config, self.profile)
            if genie.log:
                genie.call("GenieDialogConfig_bindLogger", self.config, genie.log)
            t = time.perf_counter()
            genie.call("GenieDialog_create", self.config, ctypes.byref(self.handle))
            self.create_wall_s = time.perf_counter() - t
            tokenizer = _H()
            genie.call("GenieDialog_getTokenizer", self.handle, ctypes.byref(tokenizer))
            self.tokenizer = tokenizer
        except BaseException:
            self.free()
            raise
        self.create_event = next((e for e in self.new_events() if e.get("type") == "GenieDialog_create"), {})

    def profile_json(self):
        """Return the profile handle's JSON document (every event since the dialog's creation)."""
        self.genie.call("GenieProfile_getJsonData", self.profile, self.buffers.callback, ctypes.byref(_H()))
        buf = self.buffers.take()
        return json.loads(buf.value.decode()) if buf is not None and buf.value else {}

    def new_events(self):
        """Return the dialog's profile events not returned before."""
        events = [e for c in self.profile_json().get("components", []) for e in c.get("events", [])]
        fresh, self._events_seen = events[self._events_seen:], len(events)
        return fresh

    def encode(self, text):
        """Return Genie's tokenizer's ids of text."""
        n = ctypes.c_uint32()
        self.genie.call("GenieTokenizer_encode", self.tokenizer, text.encode(), self.buffers.callback,
                        ctypes.byref(_H()), ctypes.byref(n))
        buf = self.buffers.take()
        if not n.value:
            return []
        return list((ctypes.c_int32 * n.value).from_buffer(buf))

    def decode(self, ids):
        """Return Genie's tokenizer's text of ids."""
        if not ids:
            return ""
        arr = (ctypes.c_int32 * len(ids))(*ids)
        self.genie.call("GenieTokenizer_decode", self.tokenizer, arr, len(ids), self.buffers.callback,
                        ctypes.byref(_H()))
        buf = self.buffers.take()
        return buf.value.decode(errors="replace") if buf is not None else ""

    def query(self, prompt, max_new):
        """Reset, then query prompt (text or token ids) for at most max_new tokens; return the raw outcome."""
        g = self.genie
        g.call("GenieDialog_reset", self.handle)
        g.call("GenieDialog_setMaxNumTokens", self.handle, int(max_new))
        chunks, ids, codes = [], [], []
        t = time.perf_counter()
        if isinstance(prompt, str):
            def on_text(response, code, _user):
                codes.append(code)
                chunks.append((response or b"").decode(errors="replace"))

            callback = QueryCallback(on_text)
            status = g.call("GenieDialog_query", self.handle, prompt.encode(), SENTENCE_COMPLETE, callback, None,
                            subject="prompt %r" % _short(prompt))
        else:
            def on_tokens(response, n, code, _user):
                codes.append(code)
                ids.extend(response[i] for i in range(n))

            callback = TokenQueryCallback(on_tokens)
            arr = (ctypes.c_uint32 * len(prompt))(*prompt)
            status = g.call("GenieDialog_tokenQuery", self.handle, arr, len(prompt), SENTENCE_COMPLETE, callback, None,
                            subject="prompt of %d token ids" % len(prompt))
        wall_s = time.perf_counter() - t
        events = [e for e in self.new_events() if e.get("type") in ("GenieDialog_query", "GenieDialog_tokenQuery")]
        return {"status": status, "text_chunks": chunks, "ids": ids, "codes": codes, "wall_s": wall_s,
                "event": events[-1] if events else {}}

    def free(self):
        g = self.genie
        if self.handle:
            g.lib.GenieDialog_free(self.handle)
            self.handle = _H()
        if self.config:
            g.lib.GenieDialogConfig_free(self.config)
            self.config = _H()
        if self.profile:
            g.lib.GenieProfile_free(self.profile)
            self.profile = _H()


def _short(text, n=60):
    return text if len(text) <= n else text[:n] + "..."


# --- profile events ---------------------------------------------------------------------------------------

_TIME_SCALE_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "ns": 1e-6}


def _field(event, key):
    """Return (value, unit) of a profile event's {"value", "unit"} field, or (None, None)."""
    item = event.get(key)
    if isinstance(item, dict):
        return item.get("value"), item.get("unit", "")
    return None, None


def _ms(event, key):
    value, unit = _field(event, key)
    if value is None:
        return None
    if unit not in _TIME_SCALE_MS:
        raise RunnerFailure("Genie's profile field %s has unit %r; expected one of %s" % (
            key, unit, sorted(_TIME_SCALE_MS)), 3)
    return float(value) * _TIME_SCALE_MS[unit]


def _rate(event, key):
    value, unit = _field(event, key)
    if value is None:
        return None
    if unit not in ("toks/sec", "tokens/s"):
        raise RunnerFailure("Genie's profile field %s has unit %r; expected toks/sec" % (key, unit), 3)
    return float(value)


def _count(event, key):
    value, _ = _field(event, key)
    return int(value) if value is not None else None


def kpis_of_event(event):
    """Return the result.json KPIs of one GenieDialog_query profile event."""
    return {"num_prompt_tokens": _count(event, "num-prompt-tokens"),
            "num_generated_tokens": _count(event, "num-generated-tokens"),
            "time_to_first_token_ms": _ms(event, "time-to-first-token"),
            "prompt_tokens_per_s": _rate(event, "prompt-processing-rate"),
            "tokens_per_s": _rate(event, "token-generation-rate"),
            "token_generation_time_ms": _ms(event, "token-generation-time")}


# --- the bundle -------------------------------------------------------------------------------------------

def _load_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise RunnerFailure("%s %s: cannot be read: %s" % (what, path, e.strerror or e)) from None
    except ValueError as e:
        raise RunnerFailure("%s %s: not valid JSON (%s)" % (what, path, e)) from None


def check_bundle(config_path):
    """Return (config dict, bundle folder, dims) after checking the files the config names exist and parse."""
    config = _load_json(config_path, "Genie config")
    folder = os.path.dirname(os.path.abspath(config_path))
    try:
        dialog = config["dialog"]
        context = dialog["context"]
        engine = dialog["engine"]
        engines = engine if isinstance(engine, list) else [engine]
        tokenizer = dialog["tokenizer"]["path"]
    except (KeyError, TypeError) as e:
        raise RunnerFailure("Genie config %s: no %s; expected dialog.context, dialog.tokenizer.path and "
                            "dialog.engine (write it with harness.llm.genie_config)" % (config_path, e)) from None
    tok_path = os.path.join(folder, tokenizer)
    tok = _load_json(tok_path, "tokenizer")
    if not isinstance(tok, dict) or not isinstance(tok.get("model"), dict):
        raise RunnerFailure("tokenizer %s: not a Hugging Face tokenizer.json (expected a JSON object with a "
                            "'model' object)" % tok_path)
    bins = []
    for eng in engines:
        model = eng.get("model", {})
        for name in model.get("binary", {}).get("ctx-bins", []):
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                raise RunnerFailure("context binary %s named in %s (dialog.engine.model.binary.ctx-bins) is "
                                    "missing: expected the serialized QNN context file there" % (path, config_path))
            bins.append(path)
        ext = eng.get("backend", {}).get("extensions")
        if ext:
            _load_json(os.path.join(folder, ext), "backend extensions config")
    if not bins:
        raise RunnerFailure("Genie config %s names no context binaries (dialog.engine.model.binary.ctx-bins)"
                            % config_path)
    dims = {"context_length": int(context.get("size", 0)), "n_vocab": context.get("n-vocab"),
            "eot_token": context.get("eot-token"), "ctx_bins": [os.path.basename(b) for b in bins]}
    return config, folder, dims


def load_prompts(path):
    """Return the prompts of a JSON list of strings (text) or lists of non-negative ints (token ids)."""
    prompts = _load_json(path, "prompts")
    if not isinstance(prompts, list) or not prompts:
        raise RunnerFailure("prompts %s: expected a non-empty JSON list of strings (or of token-id lists)" % path)
    for k, p in enumerate(prompts):
        ok = (isinstance(p, str) and p) or (isinstance(p, list) and p and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p))
        if not ok:
            raise RunnerFailure("prompts %s: prompt %d is %r; expected a non-empty string or a non-empty list of "
                                "token ids" % (path, k, p))
    return prompts


def _prompt_label(prompt):
    return repr(_short(prompt)) if isinstance(prompt, str) else "of %d token ids" % len(prompt)


def prompt_ids(dialog, prompt):
    """Return the prompt's token ids (Genie's tokenizer for text)."""
    return dialog.encode(prompt) if isinstance(prompt, str) else list(prompt)


def check_fits(prompts_ids, prompts, context, max_new, path):
    """Refuse (exit 2) a prompt that leaves no room to generate in the context."""
    for k, (ids, prompt) in enumerate(zip(prompts_ids, prompts)):
        if len(ids) >= context:
            raise RunnerFailure("prompts %s: prompt %d %s is %d tokens; the context holds %d, so a prompt may have "
                                "at most %d tokens (context - 1) to leave room to generate"
                                % (path, k, _prompt_label(prompt), len(ids), context, context - 1))


def room(max_new, context, ids):
    """Return max_new capped so that prompt plus generated tokens fill at most the context (Genie returns
    GENIE_STATUS_WARNING_CONTEXT_EXCEEDED, records no profile event, and may fail the next query after a
    reset when a query runs past it)."""
    return max(1, min(max_new or context, context - len(ids)))


def _outcome_row(prompt, ids, outcome, dialog):
    """Return one result.json prompt row from a query's outcome."""
    text_prompt = isinstance(prompt, str)
    generated = None if text_prompt else outcome["ids"]
    text = "".join(outcome["text_chunks"]) if text_prompt else dialog.decode(generated)
    row = {"prompt": prompt, "prompt_ids": ids if text_prompt else None, "generated_ids": generated, "text": text,
           **kpis_of_event(outcome["event"]), "query_wall_ms": 1e3 * outcome["wall_s"],
           "status_name": status_name(outcome["status"]),
           "sentence_codes": sorted({SENTENCE.get(c, str(c)) for c in outcome["codes"]}),
           "profile": outcome["event"]}
    if row["num_generated_tokens"] is None and generated is not None:
        row["num_generated_tokens"] = len(generated)
    return row


# --- dialog -----------------------------------------------------------------------------------------------

def run_dialog(args, report):
    config, folder, dims = check_bundle(args.config)
    prompts = load_prompts(args.prompts)
    report["context_length"] = dims["context_length"]
    report["ctx_bins"] = dims["ctx_bins"]
    genie = Genie(args.lib)
    report["genie_api_version"] = genie.version
    try:
        os.chdir(folder)
        dialog = Dialog(genie, json.dumps(config))
        try:
            report["init_wall_ms"] = 1e3 * dialog.create_wall_s
            report["init_time_ms"] = _ms(dialog.create_event, "init-time") or report["init_wall_ms"]
            ids = [prompt_ids(dialog, p) for p in prompts]
            check_fits(ids, prompts, dims["context_length"], args.max_new, args.prompts)
            report["prompts"] = []
            for prompt, pid in zip(prompts, ids if not args.t2t_run else []):
                longest_s = max((r["query_wall_ms"] / 1e3 for r in report["prompts"]), default=None)
                if longest_s is not None and out_of_budget(args, longest_s):
                    break
                max_new = room(args.max_new, dims["context_length"], pid)
                row = _outcome_row(prompt, pid, dialog.query(prompt, max_new), dialog)
                report["prompts"].append(dict(row, max_new=max_new))
        finally:
            dialog.free()
    finally:
        genie.close()
        report["genie_log"] = list(genie.log_lines)
    if args.t2t_run:
        run_t2t(args, config, folder, prompts, ids, report)
    report["remaining"] = {"prompts": len(prompts) - len(report["prompts"])}


def out_of_budget(args, item_s):
    """True when one more prompt as long as item_s would likely end past --budget_s (device_runner.past_budget)."""
    return device_runner.past_budget(args.started, getattr(args, "budget_s", None), item_s)


# --- genie-t2t-run ----------------------------------------------------------------------------------------

T2T_BEGIN, T2T_END = "[BEGIN]: ", "[END]"
T2T_VERSION = "Using libGenie.so version "


def parse_t2t_stdout(stdout):
    """Return (text, api version or None) of genie-t2t-run's stdout ("[BEGIN]: text[END]")."""
    version = None
    for line in stdout.splitlines():
        if line.startswith(T2T_VERSION):
            version = line[len(T2T_VERSION):].strip()
    begin = stdout.find(T2T_BEGIN)
    if begin < 0:
        return None, version
    end = stdout.find(T2T_END, begin)
    return stdout[begin + len(T2T_BEGIN):end if end >= 0 else len(stdout)], version


def run_t2t(args, config, folder, prompts, ids, report):
    """Run each prompt through a genie-t2t-run process; fill report's prompts from its stdout and profile."""
    if not os.path.isfile(args.t2t_run) or not os.access(args.t2t_run, os.X_OK):
        raise RunnerFailure("genie-t2t-run %s: not an executable file" % args.t2t_run)
    work = os.path.join(args.output_dir, "t2t")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    lib_dir = os.path.dirname(os.path.abspath(args.lib)) if os.sep in args.lib else ""
    if lib_dir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([lib_dir] + [p for p in env.get("LD_LIBRARY_PATH", "").split(
            os.pathsep) if p])
    report["prompts"], init_ms, walls = [], [], []
    for k, (prompt, pid) in enumerate(zip(prompts, ids)):
        if walls and out_of_budget(args, max(walls)):
            break
        if not isinstance(prompt, str):
            raise RunnerFailure("--t2t_run takes text prompts; prompt %d is a token-id list" % k)
        prompt_file, profile_file = os.path.join(work, "prompt_%d.txt" % k), os.path.join(work, "profile_%d.json" % k)
        config_path = os.path.join(work, "genie_config_%d.json" % k)
        cfg = json.loads(json.dumps(config))
        max_new = room(args.max_new, int(config["dialog"]["context"]["size"]), pid)
        cfg["dialog"]["max-num-tokens"] = max_new  # genie-t2t-run has no flag for it
        _write_json(config_path, cfg)
        with open(prompt_file, "w", encoding="utf-8") as f:
            f.write(prompt)
        if os.path.exists(profile_file):  # genie-t2t-run refuses an existing profile file
            os.unlink(profile_file)
        argv = [os.path.abspath(args.t2t_run), "-c", config_path, "--prompt_file", prompt_file,
                "--profile", profile_file]
        t = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, timeout=T2T_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RunnerFailure("genie-t2t-run timed out after %.0f s on prompt %d" % (T2T_TIMEOUT_S, k), 3) from None
        wall_s = time.perf_counter() - t
        walls.append(wall_s)
        stdout, stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        if proc.returncode != 0:
            raise RunnerFailure("genie-t2t-run exited with %d on prompt %d: %s" % (
                proc.returncode, k, (stderr.strip() or stdout.strip())[-500:]), 3)
        text, version = parse_t2t_stdout(stdout)
        if text is None:
            raise RunnerFailure("genie-t2t-run printed no '[BEGIN]: ' response for prompt %d: %s" % (k, stdout[-300:]),
                                3)
        profile = _load_json(profile_file, "genie-t2t-run profile")
        events = [e for c in profile.get("components", []) for e in c.get("events", [])]
        create = next((e for e in events if e.get("type") == "GenieDialog_create"), {})
        query = [e for e in events if e.get("type") == "GenieDialog_query"]
        if create:
            init_ms.append(_ms(create, "init-time"))
        report["t2t_version"] = version
        report["prompts"].append({"prompt": prompt, "prompt_ids": pid, "generated_ids": None, "text": text,
                                  **kpis_of_event(query[-1] if query else {}), "query_wall_ms": None,
                                  "process_wall_ms": 1e3 * wall_s, "status_name": status_name(SUCCESS),
                                  "max_new": max_new,
                                  "init_time_ms": init_ms[-1] if create else None,
                                  "profile": query[-1] if query else {}})
    report["t2t_run"] = os.path.abspath(args.t2t_run)
    if init_ms:
        report["init_time_ms"] = init_ms[0]


# --- stress -----------------------------------------------------------------------------------------------

M_PURGE = -101  # bionic's mallopt option returning free pages to the kernel (Android has no malloc_trim)


def release_free_memory():
    """Return the C allocator's free pages to the kernel (glibc's malloc_trim(0), bionic's mallopt(M_PURGE, 0));
    return the call's name, or None where neither exists. Freed memory the allocator keeps is not a leak:
    SmolLM2's dialogs, each created and freed, left VmRSS at 131, 193, 253, 271, 237, 246 MB after 6 rounds,
    and at 107, 116, 125, 112 MB with malloc_trim after each."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
        return "malloc_trim(0)"
    if hasattr(libc, "mallopt"):
        libc.mallopt(M_PURGE, 0)
        return "mallopt(M_PURGE, 0)"
    return None


class RssSampler(threading.Thread):
    """Samples VmRSS every interval_s on the stress clock."""

    def __init__(self, t0, interval_s):
        super().__init__(daemon=True)
        self.t0, self.interval_s, self.samples, self.release = t0, interval_s, [], None
        self._stop_event = threading.Event()

    def sample(self):
        rss = device_runner.proc_status_mb("VmRSS")
        if rss is not None:
            self.samples.append({"t_s": time.perf_counter() - self.t0, "rss_mb": rss})
        return rss

    def run(self):
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval_s)

    def sample_released(self):
        """Sample VmRSS after release_free_memory(): what live allocations hold (a leak grows it; the
        allocator's cache of freed memory does not); self.release names the call used."""
        self.release = release_free_memory()
        return self.sample()

    def stop(self):
        self._stop_event.set()
        self.join()
        return self.sample()


def stress_worker(genie, config_text, plan, rounds, worker, t0, queries, lock, barrier):
    """Run rounds dialogs in sequence, each querying every (prompt, ids, max_new) of plan; append rows. Every
    worker meets the others at barrier after each round (its action samples the RSS with all dialogs freed)."""
    for r in range(rounds):
        try:
            _stress_dialog(genie, config_text, plan, r, worker, t0, queries, lock)
        except Exception as e:  # recorded, so that the other workers are not left waiting at the barrier
            with lock:
                queries.append({"worker": worker, "round": r, "prompt_index": None, "start_s": None, "end_s": None,
                                "error": "%s: %s" % (type(e).__name__, e), "error_name": type(e).__name__})
        finally:
            barrier.wait()


def _stress_dialog(genie, config_text, plan, r, worker, t0, queries, lock):
    """One stress dialog: create, query every prompt of plan, free."""
    try:
        dialog = Dialog(genie, config_text)
    except RunnerFailure as e:
        with lock:
            queries.append({"worker": worker, "round": r, "prompt_index": None, "start_s": None, "end_s": None,
                            "error": str(e), "error_name": getattr(e, "name", type(e).__name__)})
        return
    try:
        for k, (prompt, ids, max_new) in enumerate(plan):
            row = {"worker": worker, "round": r, "prompt_index": k, "prompt_tokens": len(ids), "max_new": max_new,
                   "start_s": time.perf_counter() - t0}
            try:
                outcome = dialog.query(prompt, max_new)
                row.update(kpis_of_event(outcome["event"]))
                row.update({"status_name": status_name(outcome["status"]), "error": None, "error_name": None,
                            "text": "".join(outcome["text_chunks"]) if isinstance(prompt, str) else None,
                            "generated_ids": None if isinstance(prompt, str) else outcome["ids"]})
                if row["num_generated_tokens"] is None and outcome["ids"]:
                    row["num_generated_tokens"] = len(outcome["ids"])
                if outcome["status"] != SUCCESS and not (outcome["ids"] or "".join(outcome["text_chunks"])):
                    # Genie refused the prompt (a prompt past context - the prefill graph's AR + 1 tokens does this)
                    row.update({"error": "prompt %d of %d tokens: %s with nothing generated (%s)"
                                % (k, len(ids), row["status_name"], STATUS[outcome["status"]][1]),
                                "error_name": row["status_name"]})
            except RunnerFailure as e:
                row.update({"error": str(e), "error_name": getattr(e, "name", type(e).__name__)})
            row["end_s"] = time.perf_counter() - t0
            with lock:
                queries.append(row)
    finally:
        dialog.free()


def run_stress(args, report):
    config, folder, dims = check_bundle(args.config)
    prompts = load_prompts(args.prompts)
    context = dims["context_length"]
    report.update({"context_length": context, "ctx_bins": dims["ctx_bins"], "rounds": args.rounds,
                   "concurrent": args.concurrent, "mode": args.mode,
                   "rss_initial_mb": device_runner.proc_status_mb("VmRSS")})
    genie = Genie(args.lib)
    report["genie_api_version"] = genie.version
    config_text = json.dumps(config)
    os.chdir(folder)
    t0 = time.perf_counter()
    sampler = RssSampler(t0, args.rss_interval_s)
    sampler.start()
    queries, lock = [], threading.Lock()
    try:
        warm = Dialog(genie, config_text)  # loads the libraries and binaries once; its RSS is the baseline
        try:
            ids = [prompt_ids(warm, p) for p in prompts]
            check_fits(ids, prompts, context, args.max_new, args.prompts)
            order = sorted(range(len(prompts)), key=lambda k: len(ids[k]))
            plan = [(prompts[k], ids[k], room(args.max_new, context, ids[k])) for k in order]
            plan[-1] = plan[-1][:2] + (room(0, context, plan[-1][1]),)  # the longest prompt fills the context
            warm.query(plan[0][0], 1)
        finally:
            warm.free()
        report["prompt_order"] = order
        report["rss_warm_mb"] = sampler.sample()
        after_round = []
        if args.mode == "threads":
            barrier = threading.Barrier(args.concurrent, action=lambda: after_round.append(sampler.sample_released()))
            threads = [threading.Thread(target=stress_worker, args=(genie, config_text, plan, args.rounds, w, t0,
                                                                    queries, lock, barrier))
                       for w in range(args.concurrent)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            rows, sampler.release = _stress_processes(args, t0, after_round)
            queries.extend(rows)
    finally:
        sampler.stop()
        genie.close()
        report["genie_log"] = list(genie.log_lines)
    queries.sort(key=lambda q: (q["end_s"] is None, q["end_s"] or 0.0))
    failed = [q for q in queries if q.get("error")]
    names = {}
    for q in failed:
        names[q["error_name"]] = names.get(q["error_name"], 0) + 1
    start, end = (after_round[0], after_round[-1]) if after_round else (None, None)
    report.update({"rss_after_round_mb": after_round, "rss_start_mb": start, "rss_end_mb": end,
                   "rss_release": sampler.release,
                   "queries": queries, "errors": len(failed), "error_names": names,
                   "dialogs": args.rounds * args.concurrent,
                   "rss_growth_mb": end - start if start is not None and end is not None else None,
                   "rss_peak_mb": max([s["rss_mb"] for s in sampler.samples] or [None]),
                   "rss_series": sampler.samples,
                   "token_rate_series": [{"t_s": q["end_s"], "tokens_per_s": q.get("tokens_per_s"),
                                          "worker": q["worker"]} for q in queries if not q.get("error")]})
    if failed:
        raise RunnerFailure("%d of %d stress queries failed; first: %s" % (len(failed), len(queries),
                                                                          failed[0]["error"]), 3)


def _stress_processes(args, t0, after_round):
    """Run each worker as a copy of this runner (stress --concurrent 1); return their query rows and how they
    released free memory before sampling (rss_release), and append to after_round the sum over the copies of each
    round's RSS."""
    procs = []
    for w in range(args.concurrent):
        out = os.path.join(args.output_dir, "worker_%d" % w)
        argv = [sys.executable, os.path.abspath(__file__), "stress", "--config", args.config, "--prompts",
                args.prompts, "--rounds", str(args.rounds), "--concurrent", "1", "--mode", "threads",
                "--output_dir", out, "--lib", args.lib, "--rss_interval_s", repr(args.rss_interval_s)]
        if args.max_new:
            argv += ["--max_new", str(args.max_new)]
        procs.append((w, out, time.perf_counter() - t0, subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                                        stderr=subprocess.PIPE)))
    rows, per_child, release = [], [], None
    for w, out, offset, proc in procs:
        _, stderr = proc.communicate()
        try:
            child = _load_json(os.path.join(out, RESULT_FILE), "worker result")
        except RunnerFailure:
            child = {"queries": [], "error": stderr.decode(errors="replace").strip() or "exit %d" % proc.returncode}
        per_child.append(child.get("rss_after_round_mb") or [])
        release = release or child.get("rss_release")
        for q in child.get("queries", []):
            q = dict(q, worker=w, pid=proc.pid)
            for key in ("start_s", "end_s"):  # the child's clock started later: shift onto this one (approx.)
                if q.get(key) is not None:
                    q[key] += offset
            rows.append(q)
        if child.get("error") and not child.get("queries"):
            rows.append({"worker": w, "round": None, "prompt_index": None, "start_s": None, "end_s": None,
                         "error": child["error"], "error_name": child.get("error_name") or "worker_failed"})
    if per_child and all(len(c) == args.rounds for c in per_child):
        after_round.extend(sum(c[r] for c in per_child) for r in range(args.rounds))
    return rows, release


# --- main -------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", required=True, help="genie_config.json in its bundle folder")
    common.add_argument("--prompts", required=True, help="JSON list of strings (or token-id lists)")
    common.add_argument("--output_dir", required=True)
    common.add_argument("--lib", default=None, help="libGenie.so (default: $GENIE_LIB or the onnxruntime_qnn wheel's)")
    d = sub.add_parser("dialog", parents=[common], help="one dialog, each prompt queried after a reset")
    d.add_argument("--max_new", type=int, required=True, help="at most this many generated tokens per prompt")
    d.add_argument("--t2t_run", help="run Qualcomm's genie-t2t-run binary at this path instead of the C API")
    d.add_argument("--budget_s", type=float, help="stop before a prompt that would likely end past this many "
                   "seconds from the start, and report how many are left (`remaining`)")
    s = sub.add_parser("stress", parents=[common], help="repeated and concurrent dialogs up to the full context")
    s.add_argument("--rounds", type=int, default=3, help="dialogs in sequence per worker")
    s.add_argument("--concurrent", type=int, default=1, help="workers at once, each with its own dialog")
    s.add_argument("--max_new", type=int, default=0, help="cap on generated tokens per query but the longest, which fills the context "
                                                          "(default: every query fills it)")
    s.add_argument("--mode", choices=["threads", "processes"], default="processes",
                   help="concurrent dialogs as processes (default) or threads of one process: two dialogs of one "
                        "process crash libGenie 1.21 on the HTP simulator now and then (SIGSEGV)")
    s.add_argument("--rss_interval_s", type=float, default=0.2)
    args = p.parse_args(argv)
    if args.max_new < (1 if args.command == "dialog" else 0):
        p.error("--max_new must be at least 1")
    if args.command == "stress" and (args.rounds < 1 or args.concurrent < 1 or args.rss_interval_s <= 0):
        p.error("--rounds and --concurrent must be at least 1 and --rss_interval_s positive")
    for name in ("config", "prompts", "output_dir", "t2t_run"):
        if getattr(args, name, None):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    args.lib = args.lib or default_lib_path()
    if os.sep in args.lib:
        args.lib = os.path.abspath(args.lib)
    return args


def _write_json(path, data):
    with open(path + ".part", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".part", path)


def main(argv=None, reexec=False):
    """Run the runner; with reexec (the script's entry point) first re-execute with libGenie's folder on
    LD_LIBRARY_PATH when it is missing."""
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.started = started
    if reexec:
        ensure_library_path(args.lib, argv)
    os.makedirs(args.output_dir, exist_ok=True)
    report = {"runner_version": RUNNER_VERSION, "command": args.command, "config": args.config, "genie_lib": args.lib,
              "genie_api_version": None, "error": None, "error_name": None, "status": None,
              "machine": platform.machine(), "system": platform.system()}
    code = 0
    cwd = os.getcwd()
    try:
        (run_dialog if args.command == "dialog" else run_stress)(args, report)
    except GenieError as e:
        report["error"], report["error_name"], report["status"], code = str(e), e.name, e.status, e.code
    except RunnerFailure as e:
        report["error"], code = str(e), e.code
    except Exception as e:  # anything else, in its own words
        report["error"], code = "%s: %s" % (type(e).__name__, e), 3
        report["traceback"] = traceback.format_exc()
    finally:
        os.chdir(cwd)
    report["peak_rss_mb"] = device_runner.peak_rss_mb()
    _write_json(os.path.join(args.output_dir, RESULT_FILE), report)
    if report["error"]:
        print("genie_runner: %s" % report["error"], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(reexec=True))
