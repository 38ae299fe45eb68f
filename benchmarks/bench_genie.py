"""The Genie driver against the raw decode loop, and the LLM suites' wall time, on tiny_gpt.

1. Side by side on the same device (the emulated sm8650: the HTP simulator) and the same context binaries,
   alternating: greedy generation of the prompts through Genie (harness/runner/genie_runner.py over libGenie.so)
   and through the harness's own KV loop over onnxruntime sessions of the EP-context models
   (harness/runner/llm_runner.py). Prints each one's decode rate (generated tokens per second of decode time, as
   each reports it) and time to first token, and the ratio Genie / raw per round.
2. `pytest suites/ --device sm8650 --model tiny_gpt` on a fresh cache holding only the trained model (the zoo
   entry copied in): the LLM suite's cold wall time (goal: under 5 minutes), then again warm.

    python benchmarks/bench_genie.py [--cache-dir DIR] [--rounds 3] [--skip-suite]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.cache import DEFAULT_CACHE_DIR, ArtifactCache  # noqa: E402
from harness.devices import load_devices_file  # noqa: E402


def _onboarding(cache_dir: Path, sandbox: Path):
    from harness.models import resolve_model
    from harness.pipeline import Onboarding, Target
    from harness.runner.client import DeviceRunner
    from harness.transports import open_transport

    devices = load_devices_file(None)
    device = devices.select(["sm8650-emu"])[0]
    soc = devices.soc(device.soc)
    transport = open_transport(device, soc, sandbox)
    target = Target(device, soc, resolve_model("tiny_gpt", {}, None))
    return Onboarding(target, DeviceRunner(transport), ArtifactCache(cache_dir)), transport


def side_by_side(cache_dir: Path, rounds: int) -> None:
    from harness.llm.device import device_generate
    from harness.llm.genie_steps import GENIE_RUNNER, _prompts_file, push_bundle
    from harness.llm.steps import Pair

    with tempfile.TemporaryDirectory(prefix="bench-genie-") as tmp:
        onboarding, transport = _onboarding(cache_dir, Path(tmp) / "device")
        try:
            runner, files = onboarding.runner, onboarding.llm_files()
            prompts = [list(p.ids) for p in onboarding.llm_prompts()]
            binaries = onboarding.llm_context_binaries()
            ctx = Pair(binaries["prefill"].model, binaries["decode"].model)
            bundle = onboarding.llm_genie_bundle()
            genie = push_bundle(runner, bundle, bundle.name)
            max_new = files.max_new_tokens
            print(f"tiny_gpt: {len(prompts)} prompts x {max_new} new tokens, context binaries on the "
                  f"{transport.soc.id} emulator (HTP simulator)")
            print(f"{'round':>5} {'genie tok/s':>12} {'raw tok/s':>10} {'ratio':>6} {'genie ttft ms':>14} {'raw ttft ms':>12}")
            ratios = []
            for k in range(rounds):
                g = runner.run_tool(GENIE_RUNNER, ["dialog", "--config", genie.config, "--prompts",
                                                   _prompts_file(runner, prompts), "--max_new", str(max_new)])
                r = device_generate(runner, ctx.prefill, ctx.decode, [tuple(p) for p in prompts], max_new)
                g_rate = statistics.mean(p["tokens_per_s"] for p in g["prompts"] if p.get("tokens_per_s"))
                r_rate = statistics.mean(p["tokens_per_s"] for p in r["prompts"] if p.get("tokens_per_s"))
                g_ttft = statistics.mean(p["time_to_first_token_ms"] for p in g["prompts"])
                r_ttft = statistics.mean(p["time_to_first_token_s"] * 1000 for p in r["prompts"])
                ratios.append(g_rate / r_rate)
                print(f"{k + 1:>5} {g_rate:>12.2f} {r_rate:>10.2f} {g_rate / r_rate:>6.2f} {g_ttft:>14.1f} {r_ttft:>12.1f}")
            print(f"Genie / raw decode loop, tokens per second: median {statistics.median(ratios):.2f} "
                  f"(> 1: Genie faster; both on the same context binaries and simulator)")
        finally:
            transport.close()


def suite_wall(cache_dir: Path) -> None:
    source = ArtifactCache(cache_dir).root / "zoo" / "tiny_gpt"
    with tempfile.TemporaryDirectory(prefix="bench-genie-suite-") as tmp:
        fresh = Path(tmp) / "cache"
        shutil.copytree(source, fresh / "zoo" / "tiny_gpt")
        for label in ("cold (trained model cached)", "warm"):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "suites/", "--device", "sm8650", "--model",
                                   "tiny_gpt", "-q", "-p", "no:cacheprovider", "--cache-dir", str(fresh)],
                                  cwd=REPO, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                raise SystemExit(f"suite failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
            print(f"LLM suites {label}: {wall:.1f} s ({proc.stdout.strip().splitlines()[-1]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-suite", action="store_true")
    args = parser.parse_args()
    side_by_side(args.cache_dir.expanduser(), args.rounds)
    if not args.skip_suite:
        suite_wall(args.cache_dir.expanduser())


if __name__ == "__main__":
    main()
