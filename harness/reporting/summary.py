"""What a run prints at its end: the devices used and quarantined, and per device x model each step's
outcome with its headline KPI (and the confidence intervals it rests on) or the headline of why it did not
pass, the inconclusive steps and marginal passes, the devices that were out; and the run's exit status.

Exit status (what CI reads): 1 when a step failed or errored (pytest's own); else EXIT_DEVICES_OUT when a
requested device x model x step did not run because its device was quarantined, unhealthy or lost (even
when every such test was skipped); else EXIT_SKIPPED_ELSEWHERE when a requested step test was skipped by
something other than the harness (another plugin's or a conftest's fixture or hook, not a prerequisite that
failed, a step's own skip condition, a quarantined device or its suite); else EXIT_INCONCLUSIVE when a step's
evidence could not decide a limit; else 0: every requested step ran and passed. A test deselected with -k or -m
was not requested.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from harness.kpi import INTERVALS_KEY, interval_of, kpi_value
from harness.reasons import details
from harness.reasons import headline as reason_headline
from harness.reporting.records import StepRecord
from harness.steps.table import find
from harness.steps.table import num as _num

EXIT_DEVICES_OUT = 6
EXIT_INCONCLUSIVE = 7
EXIT_SKIPPED_ELSEWHERE = 8
EXIT_REASONS = {EXIT_DEVICES_OUT: "a device that was out kept requested steps from running",
                EXIT_SKIPPED_ELSEWHERE: "something other than the harness skipped requested steps",
                EXIT_INCONCLUSIVE: "a step was inconclusive: re-run it with more samples"}
OUT_OF_SERVICE = ("quarantined", "unhealthy")


def headline(record: StepRecord) -> str:
    """Return the step's headline KPI as a short text ('' when the step has none or did not run)."""
    if record.outcome not in ("passed", "failed", "inconclusive") or not record.kpis:
        return ""
    try:
        step = find(record.step)
        return step.headline(record.kpis) if step is not None and step.headline is not None else ""
    except (TypeError, ValueError, KeyError):
        return ""


def intervals_text(kpis: dict) -> str:
    """Return the KPIs' confidence intervals as 'kpi 0.125 [0.02, 0.47], n=8; ...' ('' when none)."""
    parts = []
    for kpi in (kpis.get(INTERVALS_KEY) or {}) if isinstance(kpis, dict) else ():
        interval = interval_of(kpis, kpi)
        if interval is not None:
            parts.append(f"{kpi} {_num(kpi_value(kpis, kpi), '.4g')} [{interval.low:.4g}, {interval.high:.4g}], "
                         f"n={interval.samples}")
    return "; ".join(parts)


def outcome_label(record: StepRecord) -> str:
    """Return the outcome as the table shows it: 'marginal' for a pass close to a limit."""
    return "marginal" if record.outcome == "passed" and record.marginal else record.outcome


def step_table(records: Iterable[StepRecord], verbose: int = 0) -> list[str]:
    """Return the lines of one table per device x model: step, outcome, headline KPI with its intervals (or the
    headline of the skip/failure/inconclusive reason, its details below with verbose)."""
    groups: dict[tuple[str, str], list[StepRecord]] = {}
    for r in records:
        groups.setdefault((r.device, r.model), []).append(r)
    lines = []
    for (device, model), rows in groups.items():
        lines.append(f"{device} ({rows[0].soc}) x {model}:")
        for r in rows:
            reason = reason_headline(r.message) if r.outcome != "passed" else ""
            shown = reason or headline(r)
            intervals = intervals_text(r.kpis)
            lines.append(f"  {r.step:20s} {outcome_label(r):12s} {shown}" + (f" | {intervals}" if intervals else ""))
            more = details(r.message) if reason and verbose else ""
            lines += [f"  {'':20s} {'':12s} {line.strip()}" for line in more.splitlines() if line.strip()]
    return lines


def verdict_lines(records: Iterable[StepRecord], verbose: int = 0) -> list[str]:
    """Return the inconclusive steps (each a stated reason to re-run, with what more it needs) and the
    marginal passes, one headline line each (details below with verbose)."""
    records = list(records)
    lines = []
    undecided = [r for r in records if r.outcome == "inconclusive"]
    if undecided:
        lines.append(f"INCONCLUSIVE: {len(undecided)} step(s): the evidence could not decide a limit "
                     "(not a pass): re-run with more samples")
        for r in undecided:
            lines.append(f"  {r.device} x {r.model} / {r.step}: {_unprefixed(reason_headline(r.message), r.step)}")
            lines += [f"      {line.strip()}" for line in details(r.message).splitlines() if verbose and line.strip()]
    marginal = [r for r in records if r.marginal]
    if marginal:
        lines.append(f"MARGINAL: {len(marginal)} step(s) passed close to a limit")
        for r in marginal:
            lines.append(f"  {r.device} x {r.model} / {r.step}: {reason_headline('; '.join(r.marginal))}")
            lines += [f"      {v}" for v in r.marginal if verbose and len(r.marginal) > 1]
    return lines


def _unprefixed(text: str, step: str) -> str:
    """Return a headline without the '<step>: ' it starts with (the line names the step already)."""
    return text[len(step) + 2:] if text.startswith(f"{step}: ") else text


def devices_out(devices: list[dict], records: Iterable[StepRecord]) -> list[tuple[dict, list[StepRecord]]]:
    """Return the devices that were out of service (quarantined, unhealthy, lost), each with its requested
    step records that did not run (skipped or errored) because of it."""
    records = list(records)
    return [(d, [r for r in records if r.device == d["id"] and r.outcome in ("skipped", "error")])
            for d in devices if d.get("status") in OUT_OF_SERVICE]


def incomplete_lines(devices: list[dict], records: Iterable[StepRecord]) -> list[str]:
    """Return one line per device that was out with steps that did not run: which device, why, what it missed."""
    lines = []
    for d, missed in devices_out(devices, records):
        if missed:
            steps = sorted({r.step for r in missed})
            lines.append(f"INCOMPLETE: device {d['id']} was out ({d['status']}: {d.get('reason') or 'no reason'}): "
                         f"{len(missed)} requested step test(s) did not run ({', '.join(steps)}); this is not a pass")
    return lines


class SkippedElsewhere(NamedTuple):
    """A requested step test that something other than the harness skipped: its node id, the skip's reason and
    how it came ('raised at FILE:LINE', or 'by a skip mark ...')."""

    test: str
    reason: str
    where: str


def skipped_elsewhere_lines(skips: Iterable[SkippedElsewhere]) -> list[str]:
    """Return a headline (how to find what skipped them) over one line per step test skipped by something other
    than the harness, naming it, why and where; none when there is none."""
    skips = list(skips)
    if not skips:
        return []
    return [f"NOT RUN: {len(skips)} requested step test(s) were skipped by another plugin's or a conftest's fixture "
            "or hook, not by the harness; this is not a pass (`pytest --fixtures-per-test NODEID` shows where a "
            "test's fixtures come from; `-p no:NAME` leaves a plugin out)",
            *(f"  {s.test} was skipped by something other than the harness: {s.reason} ({s.where})"
              for s in skips)]


def run_exit_status(records: Iterable[StepRecord], devices: list[dict],
                    skipped_elsewhere: Sequence[SkippedElsewhere] = ()) -> int:
    """Return the exit status of a run in which no test failed: EXIT_DEVICES_OUT when a device that was out
    kept requested steps from running, else EXIT_SKIPPED_ELSEWHERE when something other than the harness skipped
    a requested step test, else EXIT_INCONCLUSIVE when a step was inconclusive, else 0."""
    records = list(records)
    if any(missed for _, missed in devices_out(devices, records)):
        return EXIT_DEVICES_OUT
    if skipped_elsewhere:
        return EXIT_SKIPPED_ELSEWHERE
    if any(r.outcome == "inconclusive" for r in records):
        return EXIT_INCONCLUSIVE
    return 0


def device_lines(devices: list[dict], released: list[str]) -> list[str]:
    """Return one line per device: used (healthy), quarantined and why, or unused; and the released ones."""
    lines = []
    for d in devices:
        line = f"device {d['id']} ({d['soc']}, {d['transport']}): {d['status']}"
        if d.get("reason"):
            line += f": {d['reason']}" + (f" (until {d['expires']})" if d.get("expires") else "")
        lines.append(line)
    if released:
        lines.append(f"taken out of quarantine by --unquarantine: {', '.join(released)}")
    return lines
