"""Import and graph building of a published checkpoint (goal: under a minute for SmolLM2-135M-Instruct).

Times, per round, each phase of what `llm_files()` does on a cold cache for a checkpoint spec: reading the
checkpoint (GGUF metadata and tensors, dequantized to float32, the tokenizer rebuilt), authoring and writing the
prefill graph (AR-32) and the decode graph (AR-1) at context 128, and checking the pair against Genie's
convention (the pipeline's check on any pair, not counted in the import's total). Prints each phase's median
over the rounds and the total against the goal, and the machine's load average (other work slows every phase).

    python benchmarks/bench_llm_import.py [--checkpoint FILE.gguf|HF_DIR] [--rounds 2] [--context 128] [--ar 32]

Without --checkpoint it uses the corpus' SmolLM2 GGUF (`python -m harness corpus fetch` puts it there); any
architecture the importer builds is timed the same way (a GPT-2 of 124M's shape, random weights, Hugging Face
directory: read 1.0 s, prefill graph 4.1 s, decode graph 3.3 s, total 8.4 s at load average 4.3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness import corpus  # noqa: E402
from harness.llm import convention  # noqa: E402
from harness.llm.importer import read_checkpoint  # noqa: E402
from harness.llm.llama import LlamaGraphs  # noqa: E402

GOAL_S = 60.0
CORPUS_MODEL = "smollm2_135m"


def _round(checkpoint: Path, context: int, ar: int) -> dict[str, float]:
    """Return one cold import's phase times (seconds)."""
    times = {}
    with tempfile.TemporaryDirectory(prefix="bench-llm-import-") as tmp:
        out = Path(tmp)
        t = time.perf_counter()
        ck = read_checkpoint(checkpoint)
        times["read checkpoint"] = time.perf_counter() - t
        t = time.perf_counter()
        graphs = LlamaGraphs(ck, context)
        graphs.write(ar, out / "prefill.onnx")
        times[f"prefill graph (AR-{ar})"] = time.perf_counter() - t
        t = time.perf_counter()
        graphs.write(1, out / "decode.onnx")
        times["decode graph (AR-1)"] = time.perf_counter() - t
        t = time.perf_counter()
        convention.check_pair(out / "prefill.onnx", out / "decode.onnx")
        times["(check_pair, after)"] = time.perf_counter() - t
        times["graph MB"] = (out / "prefill.onnx").stat().st_size / 1e6
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--ar", type=int, default=32)
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or corpus.llm_checkpoint_path(corpus.default_dir(), CORPUS_MODEL)
    if not checkpoint.exists():
        print(f"no checkpoint at {checkpoint}: run `python -m harness corpus fetch` or pass --checkpoint", file=sys.stderr)
        return 2
    rounds = [_round(checkpoint, args.context, args.ar) for _ in range(args.rounds)]
    print(f"{checkpoint.name}: context {args.context}, prefill AR {args.ar}, {args.rounds} round(s), median seconds")
    for phase in rounds[0]:
        values = [r[phase] for r in rounds]
        print(f"  {phase:24s} {statistics.median(values):8.2f}   ({', '.join(f'{v:.2f}' for v in values)})")
    totals = [sum(v for k, v in r.items() if k not in ("graph MB", "(check_pair, after)")) for r in rounds]
    total = statistics.median(totals)
    print(f"  {'total':24s} {total:8.2f}   goal < {GOAL_S:.0f} s: {'met' if total < GOAL_S else 'MISSED'}")
    print(f"  load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
