"""`python -m harness profile-view FILE`: the per-op table of a QNN profile CSV, for people.

Like qnn-profile-viewer: one row per HTP op with its median cycles per execution, its share of
all op cycles and the cumulative share, then totals. `--model` maps ops to the ONNX nodes'
op types; `--top N` limits the rows. Exit code 2, with a one-line message, for a missing file
or a file that is not a QNN profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.models import load_onnx
from harness.profiling import QNN_INTERNAL, OpRow, QnnProfile, median_execute, op_table, parse_profile_csv


def add_parser(subparsers) -> None:
    """Register the profile-view sub-command."""
    p = subparsers.add_parser("profile-view", help="print the per-op table of a QNN profile CSV",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, help="QNN profile CSV (profiling_level=detailed)")
    p.add_argument("--top", type=int, default=None, metavar="N", help="show only the N ops with most cycles")
    p.add_argument("--model", type=Path, default=None, help="ONNX model the profile came from (for op types)")
    p.set_defaults(func=main)


def render(profile: QnnProfile, rows: list[OpRow], top: int | None = None) -> str:
    """Return the per-op table and totals as text."""
    shown = rows[:top] if top else rows
    width = max([len("node"), *(len(r.node) for r in shown)])
    type_width = max([len("op type"), *(len(r.op_type or "?") for r in shown)])
    lines = [f"QNN profile: {profile.path}",
             f"{len(profile.executions)} execution(s); cycles are medians per execution",
             "",
             f"{'#':>3}  {'node':<{width}}  {'op type':<{type_width}}  {'cycles':>12}  {'share':>7}  {'cum.':>7}"]
    lines.append("-" * len(lines[-1]))
    for i, r in enumerate(shown, 1):
        lines.append(f"{i:>3}  {r.node:<{width}}  {r.op_type or '?':<{type_width}}  {r.cycles:>12,}  "
                     f"{r.share:>7.1%}  {r.cumulative:>7.1%}")
    total = sum(r.cycles for r in rows)
    execute = median_execute(profile)
    lines.append("")
    lines.append(f"ops: {len(rows)}" + (f" ({len(rows) - len(shown)} not shown)" if len(shown) < len(rows) else ""))
    lines.append(f"total op cycles: {total:,}")
    internal = [r for r in rows if r.op_type == QNN_INTERNAL]
    if internal:
        lines.append(f"QNN-internal ops (no source node, e.g. inside an If): {len(internal)}, "
                     f"{sum(r.cycles for r in internal):,} cycles")
    if execute["accelerator_cycles"] is not None:
        lines.append(f"accelerator execute cycles: {int(execute['accelerator_cycles']):,}")
    if execute["accelerator_us"] is not None:
        lines.append(f"accelerator execute time: {execute['accelerator_us']:,.0f} us")
    if execute["qnn_execute_us"] is not None:
        lines.append(f"QNN execute time: {execute['qnn_execute_us']:,.0f} us")
    if profile.events_us:
        lines.append("other events (first occurrence):")
        lines.extend(f"  {name}: {us:,.0f} us" for name, us in profile.events_us.items())
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Print the table for args.file; return the exit code (2 on bad input)."""
    try:
        profile = parse_profile_csv(args.file)
        op_types = None
        if args.model is not None:
            op_types = {n.name: n.op_type for n in load_onnx(args.model).graph.node if n.name}
        rows = op_table(profile, op_types)
    except HarnessError as e:
        print(f"profile-view: {e}", file=sys.stderr)
        return 2
    if args.top is not None and args.top < 1:
        print("profile-view: --top must be at least 1", file=sys.stderr)
        return 2
    print(render(profile, rows, args.top))
    return 0
