"""`python -m harness history list|show|tag`: the runs in the results database (default: $HARNESS_RESULTS_DB,
else the SQLite file in the cache directory, $HARNESS_CACHE_DIR or ~/.cache/snapdragon-harness), as plain text.

  list [--device D] [--model M] [--last N]   the last runs, newest first, with their steps' outcomes
  show RUN                                   one run: identity, environment, models, devices, step records
  tag RUN NAME                               name a run (e.g. release-2026.12); a name names one run

RUN is a run's number (as `list` shows it), a tag, or the start of its uid. Bad input (an unknown run, a
database that cannot be reached) is a one-line error and exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.cache import DEFAULT_CACHE_DIR
from harness.errors import HarnessError
from harness.history.database import OFF, RESULTS_DB_VARIABLE, HistoryError, mask, results_url
from harness.history.store import ResultsStore, RunDetail, RunSummary
from harness.kpi import INTERVALS_KEY
from harness.options import bounded
from harness.reasons import headline
from harness.reporting.records import OUTCOMES

EXIT_BAD_INPUT = 2


def add_parser(subparsers) -> None:
    """Register the history sub-command."""
    p = subparsers.add_parser("history", help="list, show and tag the runs in the results database",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-db", default=None, metavar="URL",
                   help=f"the database (default: ${RESULTS_DB_VARIABLE}, else sqlite:///<cache dir>/results.db)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the last runs, newest first")
    listing.add_argument("--device", default=None, help="only runs on this device")
    listing.add_argument("--model", default=None, help="only runs of this model")
    listing.add_argument("--last", type=bounded(int, 1, "a number of runs (1 or more)"), default=20, metavar="N", help="how many runs (default 20)")
    show = actions.add_parser("show", help="one run in full")
    show.add_argument("run", metavar="RUN", help="a run number, a tag or a uid prefix")
    tag = actions.add_parser("tag", help="name a run (the name moves from the run that had it)")
    tag.add_argument("run", metavar="RUN", help="a run number, a tag or a uid prefix")
    tag.add_argument("name", metavar="NAME", help="the tag, e.g. release-2026.12")
    for sub in (listing, show, tag):  # --results-db after the action too
        sub.add_argument("--results-db", default=argparse.SUPPRESS, metavar="URL", help=argparse.SUPPRESS)
    p.set_defaults(func=main)


def results_db(given: str | None) -> str:
    """Return the database the command reads: given, else $HARNESS_RESULTS_DB, else the default cache's file.
    HistoryError for `none`."""
    url = results_url(given, Path(os.environ.get("HARNESS_CACHE_DIR") or DEFAULT_CACHE_DIR))
    if url is None:
        raise HistoryError(f"--results-db {OFF}: no database to read (give its URL)")
    return url


def main(args: argparse.Namespace) -> int:
    """Run the action; print its table; return 0, or 2 for bad input."""
    try:
        store = ResultsStore.open(results_db(args.results_db), create=False)
        try:
            print(_ACTIONS[args.action](store, args))
        finally:
            store.close()
    except HarnessError as e:
        print(f"history: {str(e).splitlines()[0]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _list(store: ResultsStore, args: argparse.Namespace) -> str:
    runs = store.list_runs(args.device, args.model, args.last)
    if not runs:
        where = " and ".join(f"{k} {v}" for k, v in (("device", args.device), ("model", args.model)) if v)
        return f"no runs{' of ' + where if where else ''} in {mask(store.url)}"
    return table(["run", "started", "exit", "steps", "devices", "models", "commit", "branch", "ci job", "tags"],
                 [_summary_row(r) for r in runs])


def _summary_row(r: RunSummary) -> list[str]:
    return [str(r.id), _time(r.started_at), "unfinished" if r.exit_status is None else str(r.exit_status),
            outcome_counts(r.outcomes), ",".join(r.devices), ",".join(r.models), (r.git_commit or "")[:10],
            r.git_branch or "", r.ci_job or "", ",".join(r.tags)]


def outcome_counts(outcomes: dict[str, int]) -> str:
    """Return '5 passed, 1 failed' (in OUTCOMES order), or 'none'."""
    keys = [k for k in OUTCOMES if k in outcomes] + sorted(set(outcomes) - set(OUTCOMES))
    return ", ".join(f"{outcomes[k]} {k}" for k in keys) or "none"


def _time(iso: str | None) -> str:
    return (iso or "").replace("T", " ").replace("+00:00", "Z")


def _show(store: ResultsStore, args: argparse.Namespace) -> str:
    return render_run(store.show_run(args.run))


def render_run(d: RunDetail) -> str:
    """Return a run as `history show` prints it."""
    run = d.run
    status = "unfinished (still running, or killed)" if run["exit_status"] is None else str(run["exit_status"])
    identity = [("run", f"{run['id']} (uid {run['uid']})"), ("harness run id", run["harness_run"]),
                ("started", _time(run["started_at"])), ("finished", _time(run["finished_at"]) or "-"),
                ("duration", f"{run['duration_s']:.1f} s" if run["duration_s"] is not None else "-"),
                ("exit status", status), ("host", run["host"] or "-"),
                ("commit", " ".join(x for x in (run["git_commit"], run["git_branch"] and f"({run['git_branch']})")
                                    if x) or "-"),
                ("ci job", " ".join(x for x in (run["ci_name"], run["ci_job"], run["ci_url"]) if x) or "-"),
                ("tags", ", ".join(d.tags) or "-"),
                ("environment", _pairs(run["environment"])), ("toolchain", _pairs(run["toolchain"]))]
    width = max(len(k) for k, _ in identity)
    lines = [f"{k:<{width}}  {v}" for k, v in identity]
    lines += ["", "models:", table(["model", "kind", "digest", "commit", "branch", "source"],
                                   [[m["model"], m["kind"] or "", (m["digest"] or "-")[:16],
                                     (m["git_commit"] or "-")[:10], m["git_branch"] or "", m["source"] or ""]
                                    for m in d.models])]
    lines += ["", "devices:", table(["device", "soc", "transport", "status", "reason"],
                                    [[x["device"], x["soc"] or "", x["transport"] or "", x["status"] or "",
                                      x["reason"] or ""] for x in d.devices])] if d.devices else \
        ["", "devices: - (the run did not end)"]
    lines += ["", f"records ({len(d.records)}):",
              table(["device", "model", "step", "outcome", "kpis", "headline"],
                    [[r.device, r.model, r.step, r.outcome, str(sum(1 for k in r.kpis if k != INTERVALS_KEY)),
                      headline(r.message, 100)] for r, _, _ in d.records])]
    return "\n".join(lines)


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items() if v is not None) or "-"


def _tag(store: ResultsStore, args: argparse.Namespace) -> str:
    run_id, before = store.tag_run(args.run, args.name)
    return f"tagged run {run_id} {args.name.strip()}" + (f" (moved from run {before})" if before else "")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return rows as a plain text table under header, columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


_ACTIONS = {"list": _list, "show": _show, "tag": _tag}
