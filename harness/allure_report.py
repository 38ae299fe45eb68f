"""`python -m harness report RESULTS`: an offline Allure report a release manager can sign off.

Builds the report with the Allure 3 command line (Node.js, no Java; `npm install --prefix
tools/allure` installs the pinned version), as one self-contained `index.html` by default, then
removes every script the generator loads from an outside host (Allure 3 adds an analytics tag to
each page): a sign-off report is opened offline and must not phone home.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

REPO_CLI = Path(__file__).resolve().parent.parent / "tools" / "allure" / "node_modules" / ".bin" / "allure"
GENERATE_TIMEOUT_S = 300

_EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"'](?:https?:)?//[^\"']*[\"'][^>]*>\s*</script>\s*",
                              re.IGNORECASE)
_ANALYTICS_INLINE = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*\bgtag\s*\((?:(?!</script>).)*</script>\s*",
                               re.IGNORECASE | re.DOTALL)


class ReportError(HarnessError):
    """The Allure report could not be built."""


@dataclass(frozen=True)
class ReportSummary:
    """What the generated report says: where it is, the test counts, and the overall status."""

    index_html: Path
    status: str
    stats: dict[str, int]
    scripts_removed: int


def find_allure_cli() -> list[str]:
    """Return the argv prefix of the Allure 3 CLI: $ALLURE_CLI, tools/allure's install, or `allure` on PATH."""
    for candidate in (os.environ.get("ALLURE_CLI"), str(REPO_CLI), shutil.which("allure")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return [candidate]
    raise ReportError("the Allure 3 command line is not installed: run `npm install --prefix tools/allure` "
                      "(Node.js and npm needed), or set ALLURE_CLI to an `allure` 3.x executable")


def strip_external_scripts(html: str) -> tuple[str, int]:
    """Return html without scripts loaded from other hosts or analytics snippets, and how many went."""
    html, external = _EXTERNAL_SCRIPT.subn("", html)
    html, inline = _ANALYTICS_INLINE.subn("", html)
    return html, external + inline


DEFAULT_NAME = "Snapdragon onboarding report"


def generate_report(results: Path, out: Path, single_file: bool = True, name: str = DEFAULT_NAME) -> ReportSummary:
    """Build the report of an allure-pytest results directory into out; return its summary.

    Raises ReportError naming the directory when there are no results or the generator fails.
    """
    results, out = Path(results), Path(out)
    if not results.is_dir() or not any(results.glob("*-result.json")):
        raise ReportError(f"{results}: no Allure results (*-result.json); run pytest with --alluredir {results}")
    argv = [*find_allure_cli(), "awesome", *(["--single-file"] if single_file else []), "--report-name", name,
            str(results), "-o", str(out)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S,
                              env={**os.environ, "ALLURE_NO_ANALYTICS": "true"})
    except subprocess.TimeoutExpired:
        raise ReportError(f"allure did not finish within {GENERATE_TIMEOUT_S} s building {results}") from None
    if proc.returncode != 0 or not (out / "index.html").is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ReportError(f"allure failed to build the report of {results} (exit {proc.returncode}): "
                          + " | ".join(tail))
    removed = 0
    for page in out.rglob("*.html"):
        cleaned, n = strip_external_scripts(page.read_text(encoding="utf-8"))
        if n:
            tmp = page.with_name(page.name + ".part")
            tmp.write_text(cleaned, encoding="utf-8")
            os.replace(tmp, page)
            removed += n
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return ReportSummary(out / "index.html", summary.get("status", "unknown"), summary.get("stats", {}), removed)


def add_parser(subparsers) -> None:
    """Register the report sub-command."""
    p = subparsers.add_parser("report", help="build an offline Allure report from --alluredir results",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="the directory given to pytest's --alluredir")
    p.add_argument("-o", "--output", type=Path, default=Path("allure-report"), help="report directory")
    p.add_argument("--name", default=DEFAULT_NAME, help=f"the report's title (default: {DEFAULT_NAME})")
    p.add_argument("--multi-file", action="store_true",
                   help="a multi-file report (needs an HTTP server to view; the default is one index.html)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Build the report; print where it is and its totals; return 0, or 2 when it cannot be built."""
    try:
        summary = generate_report(args.results, args.output, single_file=not args.multi_file, name=args.name)
    except HarnessError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{v} {k}" for k, v in summary.stats.items() if k != "total")
    print(f"report: {summary.index_html} ({summary.stats.get('total', 0)} tests: {counts or 'none'}; "
          f"status {summary.status}; {summary.scripts_removed} external script(s) removed)")
    return 0
