"""w4a16 with one scale per output channel against block-wise (LPBQ) 4-bit weights, side by side on one model.

Builds the model's w4a16 pair once (onnxruntime's quantizer, per output channel), re-encodes its linear weights
block-wise (harness/llm/blockwise.py) for each block size asked, and prints the held-out perplexity of float,
each w4a16 form on the host (onnxruntime's CPU run of the QDQ graph) and, with --htp, on the HTP simulator
(CPU fallback disabled), with the ratio to float.

    python benchmarks/bench_llm_blockwise.py [--model tiny_gpt | SPEC.yaml] [--blocks 64 32] [--windows 48] [--htp]
                                             [--search-too]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_gpt")
    parser.add_argument("--blocks", type=int, nargs="+", default=[64, 32])
    parser.add_argument("--windows", type=int, default=None, help="held-out windows (default: the spec's)")
    parser.add_argument("--htp", action="store_true", help="also on the HTP simulator (slow for real models)")
    parser.add_argument("--search-too", action="store_true",
                        help="also each block size with least-squares block scales (', lsq': lpbq_encode's search)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()

    from harness.llm import blockwise, text
    from harness.llm.device import device_nll, host_nll
    from harness.llm.pipeline import LlmOnboarding
    from harness.models import resolve_model
    from harness.runner.client import DeviceRunner
    from harness.target import Target
    from harness.transports import open_transport

    devices = load_devices_file(None)
    device = devices.select(["sm8650-emu"])[0]
    soc = devices.soc(device.soc)
    cache = ArtifactCache(args.cache_dir)
    with tempfile.TemporaryDirectory(prefix="bench-lpbq-") as tmp:
        transport = open_transport(device, soc, Path(tmp) / "device") if args.htp else None
        try:
            runner = DeviceRunner(transport) if transport else None
            spec = resolve_model(args.model, {}, None)
            if spec.llm is not None:  # the per-channel form is the reference: a spec's own block size is not used
                spec = replace(spec, llm=replace(spec.llm, weight_block_size=None))
            onboarding = LlmOnboarding(Target(device, soc, spec), runner, cache)
            files, pair = onboarding.llm_files(), onboarding.llm_pair()
            ids = text.token_ids(onboarding.llm_tokenizer(), text.read_text(files.eval_text, "eval"))
            windows = text.nll_windows(ids, pair.prefill_ar, args.windows or files.eval_windows)
            floats = onboarding.llm_float_pair()
            per_channel = onboarding.llm_quantized("w4a16")
            forms = {"per channel": per_channel.prefill}
            for block in args.blocks:
                forms[f"LPBQ {block}"] = blockwise.lpbq_graph(per_channel.prefill, floats.prefill, block, cache)
                if args.search_too:
                    forms[f"LPBQ {block}, lsq"] = blockwise.lpbq_graph(per_channel.prefill, floats.prefill, block,
                                                                       cache, search=True)
            base = host_nll(floats.prefill, windows)["perplexity"]
            print(f"{args.model}: {len(windows)} windows x {windows.shape[1]} tokens; float perplexity {base:.4f}")
            print(f"{'w4a16 weights':>18} {'host QDQ':>10} {'/float':>7} {'HTP':>10} {'/float':>7} {'HTP s':>7}")
            for name, graph in forms.items():
                host = host_nll(graph, windows, emulate_qdq=True)["perplexity"]
                row = f"{name:>18} {host:>10.4f} {host / base:>7.4f}"
                if runner is not None:
                    t0 = time.perf_counter()
                    htp = device_nll(runner, graph, windows)["perplexity"]
                    row += f" {htp:>10.4f} {htp / base:>7.4f} {time.perf_counter() - t0:>7.1f}"
                print(row, flush=True)
        finally:
            if transport is not None:
                transport.close()


if __name__ == "__main__":
    main()
