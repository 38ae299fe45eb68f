"""`python -m harness report RESULTS`: an offline Allure report a release manager can sign off.

Builds the report with the Allure 3 command line (Node.js, no Java; `npm install --prefix
tools/allure` installs the pinned version), as one self-contained `index.html` by default, then
removes every script the generator loads from an outside host (Allure 3 adds an analytics tag to
each page): a sign-off report is opened offline and must not phone home.

Before generating, the results directory gets the files Allure reads beside the results, each only
when absent (a user's own are kept): `environment.properties` (harness, onnxruntime, onnxruntime-qnn,
QNN SDK and Python versions, the devices and SoCs the results name), `executor.json` (the CI job from
its environment variables, else this machine) and `categories.json` (Regression, Accuracy,
Unsupported op, Device fault; Inconclusive, the status `unknown` an inconclusive step gets; Marginal pass).
Allure 3's awesome report takes categories from its config, not from the results, so they are also
passed to it in a generated config file. History: each report appends one entry per run to a
history file (default `OUTPUT/history.jsonl`, kept when the report is regenerated) that Allure's trend
charts read.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from harness.reporting.names import DEVICE, ENVIRONMENT_NAMES, INCONCLUSIVE, MARGINAL, SOC
from harness.errors import HarnessError
from harness.files import write_text_atomically
from harness.versions import tool_versions

REPO_CLI = Path(__file__).resolve().parents[2] / "tools" / "allure" / "node_modules" / ".bin" / "allure"
GENERATE_TIMEOUT_S = 300
HISTORY_FILE = "history.jsonl"
DEFAULT_NAME = "Snapdragon onboarding report"
_ALLURE_CONFIG_NAMES = ("allurerc.js", "allurerc.mjs", "allurerc.cjs", "allurerc.ts", "allurerc.mts", "allurerc.cts",
                        "allurerc.json", "allurerc.yaml", "allurerc.yml")

_EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"'](?:https?:)?//[^\"']*[\"'][^>]*>\s*</script>\s*",
                              re.IGNORECASE)
_EMBEDDED_FILE = re.compile(r'\bd\("([^"]+)","([A-Za-z0-9+/=]*)"\)')  # a single-file report's data files
_ANALYTICS_INLINE = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*\bgtag\s*\((?:(?!</script>).)*</script>\s*",
                               re.IGNORECASE | re.DOTALL)

# Allure 2's categories.json format; Allure 3 reads the same keys (messageRegex, matchedStatuses) from its config.
# The regexes are written for both engines: Java matches the whole message, JavaScript searches it, and JavaScript
# has no inline flags, so [\s\S]* spans lines and case is spelled out.
CATEGORIES: list[dict[str, Any]] = [
    {"name": "Regression", "matchedStatuses": ["failed"], "messageRegex": r"[\s\S]*[Rr]egress[\s\S]*",
     "description": "a KPI got worse than its baseline (the regression step)"},
    {"name": "Device fault", "matchedStatuses": ["failed", "broken"],
     "messageRegex": r"[\s\S]*(taken out of the session|[Qq]uarantin|DeviceLost|timed out|not answering|"
                     r"disconnected|health check failed)[\s\S]*",
     "description": "the device was lost, timed out or quarantined, or a test broke outside its checks"},
    {"name": "Device fault", "matchedStatuses": ["broken"]},  # Allure 3 merges rules of one name
    {"name": "Unsupported op", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*(cannot run on the HTP|[Uu]nsupported|refus)[\s\S]*",
     "description": "nodes or op types the HTP does not run"},
    {"name": "Accuracy", "matchedStatuses": ["failed"],
     "messageRegex": r"[\s\S]*(task_metric|cosine_similarity|sqnr)[\s\S]*",
     "description": "a quantized model missed its accuracy KPI (task metric, cosine similarity, SQNR)"},
    {"name": "Inconclusive", "matchedStatuses": ["unknown"], "messageRegex": INCONCLUSIVE + r"[\s\S]*",
     "description": "the evidence could not decide a limit (its confidence interval straddles it): not a pass, "
                    "re-run with the samples the message names"},
    {"name": "Marginal pass", "matchedStatuses": ["passed"], "messageRegex": MARGINAL + r"[\s\S]*",
     "description": "passed, but close to a limit"},
]


class ReportError(HarnessError):
    """The Allure report could not be built."""


@dataclass(frozen=True)
class ReportSummary:
    """What the generated report says: where it is, the test counts, and the overall status."""

    index_html: Path
    status: str
    stats: dict[str, int]
    scripts_removed: int
    history: Path | None = None
    history_entries: int = 0
    extras_written: tuple[str, ...] = ()
    categories: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ResultTargets:
    """The devices and SoCs that an Allure results directory's tests name in their parameters."""

    devices: list[str] = field(default_factory=list)
    socs: list[str] = field(default_factory=list)


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


def _parameter_value(raw: str) -> str:
    """allure-pytest writes parameters as Python reprs ('sm8650-emu'); return the plain value."""
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw


def read_result_files(results: Path, strict: bool = True) -> list[tuple[Path, dict[str, Any]]]:
    """Return each *-result.json of an Allure results directory with its parsed content.

    Raises ReportError naming a file that is not valid JSON; with strict=False such a file is left out, as
    Allure itself leaves it out of the report.
    """
    out = []
    for path in sorted(Path(results).glob("*-result.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            if not strict:
                continue
            raise ReportError(f"{path}: not a readable Allure result ({e}); re-run pytest with --alluredir") from None
        if isinstance(data, dict):
            out.append((path, data))
    return out


def result_parameters(result: Mapping[str, Any]) -> dict[str, str]:
    """Return an Allure result's parameters as plain strings by name (device, soc, model, ...)."""
    return {str(p.get("name")): _parameter_value(str(p.get("value", ""))) for p in result.get("parameters") or []
            if isinstance(p, dict)}


def result_targets(results: Path) -> ResultTargets:
    """Return the devices and SoCs (with their names, 'sm8650 (Snapdragon 8 Gen 3)') the results name."""
    devices: dict[str, None] = {}
    socs: dict[str, None] = {}
    for _, result in read_result_files(results, strict=False):
        params = result_parameters(result)
        if params.get(DEVICE):
            devices[params[DEVICE]] = None
        if params.get(SOC):
            socs[params[SOC]] = None
    return ResultTargets(sorted(devices), sorted(socs))


def _escape_property(text: str, key: bool = False) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if key:
        out = re.sub(r"([=: #!])", r"\\\1", out)
    return out


def environment_properties(versions: Mapping[str, str | None], targets: ResultTargets) -> str:
    """Return the text of an Allure environment.properties file: versions, then the devices and SoCs."""
    items = [(ENVIRONMENT_NAMES.get(k, k), v) for k, v in versions.items() if v]
    items += [("devices", ", ".join(targets.devices)), ("socs", ", ".join(targets.socs))]
    return "".join(f"{_escape_property(k, key=True)}={_escape_property(str(v))}\n" for k, v in items if v)


def executor_info(name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return Allure's executor.json content: the CI job (GitHub Actions, GitLab CI, Jenkins) that the
    environment variables describe, else this machine as a local executor."""
    env = os.environ if env is None else env
    if env.get("GITHUB_RUN_ID"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
        repo_url = f"{server}/{env['GITHUB_REPOSITORY']}" if env.get("GITHUB_REPOSITORY") else server
        number = env.get("GITHUB_RUN_NUMBER", env["GITHUB_RUN_ID"])
        info = {"name": "GitHub Actions", "type": "github", "url": repo_url,
                "buildName": f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{number}",
                "buildUrl": f"{repo_url}/actions/runs/{env['GITHUB_RUN_ID']}"}
        order = env.get("GITHUB_RUN_NUMBER")
    elif env.get("GITLAB_CI") and env.get("CI_PIPELINE_ID"):
        info = {"name": "GitLab CI", "type": "gitlab", "url": env.get("CI_PROJECT_URL", ""),
                "buildName": f"{env.get('CI_JOB_NAME', 'pipeline')} #{env['CI_PIPELINE_ID']}",
                "buildUrl": env.get("CI_JOB_URL") or env.get("CI_PIPELINE_URL", "")}
        order = env.get("CI_PIPELINE_IID")
    elif env.get("JENKINS_URL") and env.get("BUILD_NUMBER"):
        info = {"name": "Jenkins", "type": "jenkins", "url": env["JENKINS_URL"],
                "buildName": f"{env.get('JOB_NAME', 'job')} #{env['BUILD_NUMBER']}", "buildUrl": env.get("BUILD_URL", "")}
        order = env.get("BUILD_NUMBER")
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        info = {"name": f"{_user()}@{socket.gethostname()}", "type": "local", "buildName": f"local run {stamp}"}
        order = None
    if order and order.isdigit():
        info["buildOrder"] = int(order)
    info["reportName"] = name
    return {k: v for k, v in info.items() if v not in ("", None)}


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


def write_allure_extras(results: Path, name: str = DEFAULT_NAME, versions: Mapping[str, str | None] | None = None,
                        env: Mapping[str, str] | None = None) -> list[str]:
    """Write environment.properties, executor.json and categories.json into an Allure results directory,
    each only when absent (a user's own file is kept); return the names of the files written.

    versions defaults to this machine's tool_versions(); pass a run's recorded environment instead when
    the report is built elsewhere than the run.
    """
    results = Path(results)
    contents = {
        "environment.properties": lambda: environment_properties(tool_versions() if versions is None else versions,
                                                                 result_targets(results)),
        "executor.json": lambda: json.dumps(executor_info(name, env), indent=2) + "\n",
        "categories.json": lambda: json.dumps(CATEGORIES, indent=2) + "\n",
    }
    written = []
    for filename, text in contents.items():
        path = results / filename
        if path.exists():
            continue
        write_text_atomically(path, text())
        written.append(filename)
    return written


def allure3_categories(results: Path) -> list[dict[str, Any]]:
    """Return the results directory's categories.json rules in the form Allure 3's config takes.

    Raises ReportError naming the file when it is not a JSON list of rules with names.
    """
    path = Path(results) / "categories.json"
    if not path.is_file():
        return []
    try:
        rules = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportError(f"{path}: not valid JSON ({e}); fix or delete it") from None
    if not isinstance(rules, list) or not all(isinstance(r, dict) and r.get("name") for r in rules):
        raise ReportError(f"{path}: expected a JSON list of categories, each with a name; fix or delete it")
    keys = ("name", "messageRegex", "traceRegex", "matchedStatuses", "flaky")
    out = []
    for rule in rules:
        kept = {k: rule[k] for k in keys if rule.get(k) is not None}
        if len(kept) > 1:  # Allure 3 refuses a rule with no matcher
            out.append(kept)
    return out


def same_run_as_last_entry(history: Path, results: Path) -> bool:
    """Return True when the history file's last entry is of these very results (a report regenerated from
    the same run), so the history gets one entry per run, not per generation."""
    if not history.is_file():
        return False
    lines = [line for line in history.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        return False
    try:
        last = json.loads(lines[-1])
    except json.JSONDecodeError:
        return False
    previous = sorted(int(tr["start"]) for tr in (last.get("testResults") or {}).values()
                      if isinstance(tr, dict) and isinstance(tr.get("start"), (int, float)))
    current = sorted(int(r["start"]) for _, r in read_result_files(results, strict=False)
                     if isinstance(r.get("start"), (int, float)))
    return bool(current) and previous == current


def drop_last_history_entry(history: Path) -> str:
    """Remove the last entry of a JSON-lines history file (atomically); return it."""
    lines = [line for line in history.read_text(encoding="utf-8").splitlines() if line.strip()]
    write_text_atomically(history, "".join(f"{line}\n" for line in lines[:-1]))
    return lines[-1] if lines else ""


def history_entries(history: Path | None) -> int:
    """Return how many runs a history file holds (0 when there is none)."""
    if history is None or not history.is_file():
        return 0
    return sum(1 for line in history.read_text(encoding="utf-8").splitlines() if line.strip())


def _allure_config(results: Path, tmp: Path) -> list[str]:
    """Return the --config arguments that pass the results' categories to Allure 3 (none when the working
    directory has the user's own allurerc, which Allure reads instead)."""
    if any(Path(name).is_file() for name in _ALLURE_CONFIG_NAMES):
        return []
    categories = allure3_categories(results)
    if not categories:
        return []
    config = tmp / "allurerc.json"
    config.write_text(json.dumps({"categories": categories}), encoding="utf-8")
    return ["--config", str(config)]


def generate_report(results: Path, out: Path, single_file: bool = True, name: str = DEFAULT_NAME,
                    history: Path | None = None, keep_history: bool = True, extras: bool = True) -> ReportSummary:
    """Build the report of an allure-pytest results directory into out; return its summary.

    With extras, writes environment.properties, executor.json and categories.json into the results first
    (write_allure_extras). With keep_history, the run is appended to history (default out/history.jsonl),
    whose earlier entries feed the report's trend charts.
    Raises ReportError naming the directory when there are no results or the generator fails.
    """
    results, out = Path(results), Path(out)
    if not results.is_dir() or not any(results.glob("*-result.json")):
        raise ReportError(f"{results}: no Allure results (*-result.json); run pytest with --alluredir {results}")
    written = write_allure_extras(results, name) if extras else []
    history = (Path(history) if history is not None else out / HISTORY_FILE) if keep_history else None
    replaced = ""
    if history is not None and same_run_as_last_entry(history, results):
        replaced = drop_last_history_entry(history)  # this generation appends the run again
    try:
        with tempfile.TemporaryDirectory(prefix="harness-allure-") as tmp:
            argv = [*find_allure_cli(), "awesome", *(["--single-file"] if single_file else []),
                    "--report-name", name, *_allure_config(results, Path(tmp)),
                    *(["--history-path", str(history.resolve())] if history is not None else []),
                    str(results), "-o", str(out)]
            _run_allure(argv, results, out)
    except HarnessError:
        if replaced and history is not None and not same_run_as_last_entry(history, results):
            with history.open("a", encoding="utf-8") as f:  # the failed generation did not append it again
                f.write(replaced + "\n")
        raise
    removed = _strip_report_scripts(out)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return ReportSummary(out / "index.html", summary.get("status", "unknown"), summary.get("stats", {}), removed,
                         history, history_entries(history), tuple(written), report_categories(out))


def report_data(out: Path, name: str) -> Any:
    """Return a data file of a generated report (e.g. 'widgets/categories.json') parsed as JSON: from the data a
    single-file index.html embeds, else from the file under out; None when the report has no such file."""
    out = Path(out)
    index = out / "index.html"
    if index.is_file():
        for path, data in _EMBEDDED_FILE.findall(index.read_text(encoding="utf-8")):
            if path == name:
                return json.loads(base64.b64decode(data))
    for candidate in (out / name, *out.glob(f"*/{name}")):
        if candidate.is_file():
            return json.loads(candidate.read_text(encoding="utf-8"))
    return None


def report_categories(out: Path) -> dict[str, int]:
    """Return the number of tests in each category of a generated report (Accuracy, Device fault, ...)."""
    widget = report_data(out, "widgets/categories.json") or {}
    nodes = widget.get("nodes") or {}
    counts = {}
    for node_id in widget.get("roots") or []:
        node = nodes.get(node_id) or {}
        if node.get("name"):
            counts[str(node["name"])] = int((node.get("statistic") or {}).get("total", 0))
    return counts


def _run_allure(argv: list[str], results: Path, out: Path) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S,
                              env={**os.environ, "ALLURE_NO_ANALYTICS": "true"})
    except subprocess.TimeoutExpired:
        raise ReportError(f"allure did not finish within {GENERATE_TIMEOUT_S} s building {results}") from None
    if proc.returncode != 0 or not (out / "index.html").is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ReportError(f"allure failed to build the report of {results} (exit {proc.returncode}): "
                          + " | ".join(tail))


def _strip_report_scripts(out: Path) -> int:
    removed = 0
    for page in out.rglob("*.html"):
        cleaned, n = strip_external_scripts(page.read_text(encoding="utf-8"))
        if n:
            write_text_atomically(page, cleaned)
            removed += n
    return removed


def add_parser(subparsers) -> None:
    """Register the report sub-command."""
    p = subparsers.add_parser("report", help="build an offline Allure report from --alluredir results",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="the directory given to pytest's --alluredir")
    p.add_argument("-o", "--output", type=Path, default=Path("allure-report"), help="report directory")
    p.add_argument("--name", default=DEFAULT_NAME, help=f"the report's title (default: {DEFAULT_NAME})")
    p.add_argument("--multi-file", action="store_true",
                   help="a multi-file report (needs an HTTP server to view; the default is one index.html)")
    p.add_argument("--history", type=Path, default=None, metavar="FILE",
                   help=f"the history file the trend charts read and this run is appended to "
                        f"(default: OUTPUT/{HISTORY_FILE}, kept when the report is regenerated)")
    p.add_argument("--no-history", action="store_true", help="neither read nor append history")
    p.add_argument("--no-extras", action="store_true",
                   help="do not write environment.properties, executor.json, categories.json into RESULTS")
    p.set_defaults(func=main)


_STATUSES = ("passed", "failed", "broken", "skipped", "unknown")


def main(args: argparse.Namespace) -> int:
    """Build the report; print where it is and its totals; return 0, or 2 when it cannot be built."""
    try:
        summary = generate_report(args.results, args.output, single_file=not args.multi_file, name=args.name,
                                  history=args.history, keep_history=not args.no_history, extras=not args.no_extras)
    except HarnessError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{summary.stats[k]} {k}" for k in _STATUSES if k in summary.stats)
    others = ", ".join(f"{v} {k}" for k, v in sorted(summary.stats.items()) if k not in _STATUSES and k != "total")
    print(f"report: {summary.index_html} ({summary.stats.get('total', 0)} tests: {counts or 'none'}"
          f"{f' ({others})' if others else ''}; status {summary.status}; "
          f"{summary.scripts_removed} external script(s) removed)")
    if summary.history is not None:
        print(f"report: history {summary.history} ({summary.history_entries} run(s))")
    if summary.categories:
        print("report: categories: " + ", ".join(f"{k} {v}" for k, v in summary.categories.items()))
    if summary.extras_written:
        print(f"report: wrote {', '.join(summary.extras_written)} into {args.results}")
    return 0
