"""`python -m harness signoff RESULTS... -o DIR`: the release sign-off page of one or several runs.

Each RESULTS is a --kpi-json file, an --alluredir directory, or a directory holding both (kpi.json and
allure-results/); several runs (one per device, from farm workers or CI jobs) are merged. DIR/index.html
is one self-contained page (inline CSS, charts as data URIs, no scripts, no outside requests): the
release verdict GO / NO-GO with its reasons, a devices x models x steps matrix of verdicts, the KPIs per
device x model with baseline deltas, the charts the steps attached, the devices' farm states and each
run's environment.

GO only when no step failed or errored, no KPI regressed against its baseline (the regression step), no
device is quarantined or unhealthy, and every expected step ran (not skipped) and was decided on every
device x model. An inconclusive step (its evidence could not decide a limit) is never a pass: with no other
reason the verdict is RE-RUN, naming each step and the samples it needs; with others, one more NO-GO reason.
Marginal passes (close to a limit) pass, flagged on the page.
Exit codes: 0 GO, 1 NO-GO, 2 bad input (no results, an unreadable KPI JSON or Allure result), 3 RE-RUN.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from harness.allure_report import tool_versions
from harness.errors import HarnessError
from harness.files import write_text_atomically
from harness.signoff.inputs import RunSet, SignoffInputError, load_runs
from harness.signoff.page import PageContext, render_page
from harness.signoff.verdict import ReleaseVerdict, decide

DEFAULT_TITLE = "Snapdragon onboarding sign-off"
EXIT_GO, EXIT_NO_GO, EXIT_BAD_INPUT, EXIT_RE_RUN = 0, 1, 2, 3

__all__ = ["Signoff", "SignoffInputError", "build_signoff", "add_parser", "main"]


@dataclass(frozen=True)
class Signoff:
    """A built sign-off: the page written, the merged runs and the release verdict."""

    index_html: Path
    runs: RunSet
    verdict: ReleaseVerdict

    @property
    def exit_code(self) -> int:
        """Return 0 for GO, 3 for RE-RUN, 1 for NO-GO."""
        return EXIT_GO if self.verdict.go else EXIT_RE_RUN if self.verdict.rerun else EXIT_NO_GO


def build_signoff(results: list[Path], out: Path, title: str = DEFAULT_TITLE, expect: str = "seen") -> Signoff:
    """Merge the runs, decide the release verdict and write out/index.html; return the Signoff.

    expect: which steps every device x model must have run: 'seen', 'all' or STEP,STEP (see verdict.expected_steps).
    Raises a HarnessError (SignoffInputError) naming the input that has no results or cannot be read.
    """
    runs = load_runs(results)
    verdict = decide(runs, expect)
    ctx = PageContext(title, datetime.now(timezone.utc).isoformat(timespec="seconds"), tool_versions())
    index = Path(out) / "index.html"
    _write_atomic(index, render_page(runs, verdict, ctx))
    return Signoff(index, runs, verdict)


def _write_atomic(path: Path, text: str) -> None:
    write_text_atomically(path, text)


def summary_lines(signoff: Signoff) -> list[str]:
    """Return what the command prints: the verdict with the page's path and counts, then one line per reason."""
    targets = signoff.runs.targets()
    devices = len({d for d, _, _ in targets})
    models = len({m for _, _, m in targets})
    head = (f"signoff: {signoff.verdict.label} - {devices} device(s) x {models} model(s) x "
            f"{len(signoff.verdict.expected_steps)} step(s) -> {signoff.index_html}")
    if signoff.verdict.go:
        return [head, "  every expected step passed; no regressions, quarantined devices or steps not run"]
    if signoff.verdict.rerun:
        return [head, f"  nothing failed, but {len(signoff.verdict.reasons)} step(s) were inconclusive: re-run them "
                      "with the samples named:", *(f"  - {r.describe()}" for r in signoff.verdict.reasons)]
    return [head, f"  {len(signoff.verdict.reasons)} reason(s):",
            *(f"  - {r.describe()}" for r in signoff.verdict.reasons)]


def add_parser(subparsers) -> None:
    """Register the signoff sub-command."""
    p = subparsers.add_parser("signoff", help="build the release sign-off page (GO / RE-RUN / NO-GO) of runs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="+", metavar="RESULTS",
                   help="a --kpi-json file, an --alluredir directory, or a directory holding kpi.json and "
                        "allure-results/ (repeatable: the runs are merged)")
    p.add_argument("-o", "--output", type=Path, default=Path("signoff"), help="output directory (default: signoff)")
    p.add_argument("--name", default=DEFAULT_TITLE, help=f"the page's title (default: {DEFAULT_TITLE})")
    p.add_argument("--expect-steps", default="seen", metavar="seen|all|STEP,...",
                   help="the steps each device x model must have run: 'seen' (default: every step any device x "
                        "model recorded), 'all' (every step of the suites), or a comma-separated list")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Build the page; print the verdict and its reasons; return 0 (GO), 1 (NO-GO), 2 (bad input) or 3 (RE-RUN)."""
    try:
        signoff = build_signoff(args.results, args.output, args.name, args.expect_steps)
    except HarnessError as e:
        print(f"signoff: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(summary_lines(signoff)))
    return signoff.exit_code
