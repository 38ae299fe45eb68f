#!/usr/bin/env python3
"""A stand-in for Qualcomm's genie-t2t-run (QAIRT SDK examples/Genie/genie-t2t-run/main.cpp) over the ctypes
driver in genie_runner.py (copied beside this file): the same flags for the paths the harness uses
(-c/--config, -p/--prompt, --prompt_file, --profile FILE (refused when FILE exists), --log LEVEL, -h) and the
same output: "Using libGenie.so version M.m.p", "[PROMPT]: ...", then "[BEGIN]: " + response + "[END]", and
with --profile GenieProfile_getJsonData's document written to FILE after the query. Exit 1 (EXIT_FAILURE) on
any error, with the message on stderr, as the real binary."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import genie_runner as gr  # noqa: E402


def parse(argv):
    opts = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print("Usage:\n%s [options]" % sys.argv[0])
            sys.exit(0)
        if arg not in ("-c", "--config", "-p", "--prompt", "--prompt_file", "--profile", "--log"):
            print("Unknown option: %s" % arg, file=sys.stderr)
            return None
        if i + 1 >= len(argv):
            print("ERROR: Invalid parameter for argument: %s" % arg, file=sys.stderr)
            return None
        value = argv[i + 1]
        if arg in ("-c", "--config"):
            if not os.path.isfile(value):
                print("                   File %s doesn't exists or is in bad shape." % value)
                return None
            with open(value) as f:
                opts["config"] = f.read()
        elif arg in ("-p", "--prompt"):
            opts["prompt"] = value
        elif arg == "--prompt_file":
            with open(value) as f:
                opts["prompt"] = f.read()
        elif arg == "--profile":
            if os.path.exists(value):
                print("ERROR: Invalid --profile argument. Output file %s already exists." % value, file=sys.stderr)
                return None
            opts["profile"] = value
        i += 2
    if "prompt" not in opts:
        print("ERROR:: Please provide prompt using --prompt or --prompt_file.", file=sys.stderr)
        return None
    return opts


def main():
    opts = parse(sys.argv[1:])
    if opts is None:
        return 1
    genie = gr.Genie(os.environ.get(gr.LIB_ENV) or gr.default_lib_path())
    print("Using libGenie.so version %s\n" % genie.version)
    try:
        dialog = gr.Dialog(genie, opts["config"])
        try:
            print("[PROMPT]: %s\n" % opts["prompt"])
            chunks = []

            def on_text(response, code, _user):
                text = (response or b"").decode(errors="replace")
                if code == 1:
                    sys.stdout.write("[BEGIN]: ")
                elif code == 3:
                    sys.stdout.write("[END]\n")
                sys.stdout.write(text)
                chunks.append(text)

            callback = gr.QueryCallback(on_text)
            genie.call("GenieDialog_query", dialog.handle, opts["prompt"].encode(), gr.SENTENCE_COMPLETE, callback,
                       None)
            sys.stdout.flush()
            if "profile" in opts:
                document = dialog.profile_json()
                with open(opts["profile"], "w") as f:
                    import json
                    json.dump(document, f, indent=2)
        finally:
            dialog.free()
    except gr.RunnerFailure as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
