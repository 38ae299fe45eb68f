"""QNN profile CSVs (the QNN EP's `profiling_level=detailed` output): parsing and the per-op table.

The CSV has the header `Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,
Event Identifier`. Each graph execution writes a ROOT row `Accelerator (execute) time (cycles)`,
then one NODE/SUB-EVENT row per HTP op, `<node>:OpId_<k> (cycles)` (or `Input OpId_2 (cycles)`
for the graph's I/O ops, or a bare `OpId_69 (cycles)` for an op QNN made itself with no source
node, e.g. inside a lowered If: named `OpId_<k>`, op type QNN_INTERNAL), then ROOT rows
`Accelerator (execute) time` and `QNN (execute) time` in microseconds (with `profiling_level=basic`
only these two, which then make the execution). Load and finalize events come before the first
execution. On the simulator cycles and times are simulated, not a phone's.
"""

from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError

HEADER = ["Msg Timestamp", "Message", "Time", "Unit of Measurement", "Timing Source", "Event Level",
          "Event Identifier"]
_NODE = re.compile(r"^(?:(?P<node>.+?)(?::| ))?OpId_(?P<op_id>\d+) \(cycles\)$")
QNN_INTERNAL = "(qnn-internal)"  # op type of a profiled op that names no source node
_UNNAMED = re.compile(r"^OpId_\d+$")
_TOKEN = re.compile(r"^(?P<base>.+?)(_token_\d+)+$")
EXECUTE_START = "Accelerator (execute) time (cycles)"


class ProfileFormatError(HarnessError):
    """A file is not a QNN profile CSV, or holds no execution the harness can read."""


@dataclass
class Execution:
    """One graph execution: cycles per HTP op, and the accelerator/QNN execute times it reported."""

    node_cycles: dict[str, int] = field(default_factory=dict)
    accelerator_cycles: int | None = None
    accelerator_us: float | None = None
    qnn_execute_us: float | None = None


@dataclass
class QnnProfile:
    """A parsed QNN profile: its executions and the other ROOT events (load, finalize) by name."""

    path: Path
    executions: list[Execution]
    events_us: dict[str, float]

    @property
    def has_node_rows(self) -> bool:
        """True when the profile holds per-op cycles (profiling level 'detailed')."""
        return any(e.node_cycles for e in self.executions)


@dataclass(frozen=True)
class OpRow:
    """One HTP op of the per-op table: median cycles per execution and its share of all op cycles."""

    node: str
    op_type: str
    op_id: int
    cycles: int
    share: float
    cumulative: float

    def as_dict(self) -> dict:
        """The row as plain JSON types."""
        return {"node": self.node, "op_type": self.op_type, "op_id": self.op_id, "cycles": self.cycles,
                "share": self.share, "cumulative": self.cumulative}


def parse_profile_csv(path: Path) -> QnnProfile:
    """Return the parsed QNN profile CSV at path.

    Raises ProfileFormatError naming the file (and line) when it is missing, is not a QNN
    profile, or holds no execute events.
    """
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise ProfileFormatError(f"{path}: cannot read: {e.strerror}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip() for c in rows[0][:len(HEADER)]] != HEADER:
        raise ProfileFormatError(f"{path}: not a QNN profile CSV (expected the header '{','.join(HEADER)}'; "
                                 "write one with the QNN EP's profiling_level=detailed and profiling_file_path)")
    executions: list[Execution] = []
    events: dict[str, float] = {}
    current: Execution | None = None
    for lineno, row in enumerate(rows[1:], 2):
        if not row:
            continue
        if len(row) < len(HEADER):
            raise ProfileFormatError(f"{path}:{lineno}: expected {len(HEADER)} columns, got {len(row)}")
        message, value, unit, level, ident = row[1].strip(), row[2].strip(), row[3].strip(), row[5].strip(), row[6]
        try:
            number = float(value)
        except ValueError:
            raise ProfileFormatError(f"{path}:{lineno}: Time '{value}' is not a number") from None
        ident = ident.strip()
        if level == "ROOT" and ident == EXECUTE_START:
            current = Execution(accelerator_cycles=int(number))
            executions.append(current)
        elif message == "NODE":
            m = _NODE.match(ident)
            if m is None:
                raise ProfileFormatError(f"{path}:{lineno}: NODE row '{ident}' does not name "
                                         "'[<node>:]OpId_<k> (cycles)'")
            if current is None:  # a profile without the execute start row
                current = Execution()
                executions.append(current)
            node = m.group("node") or f"OpId_{m.group('op_id')}"  # an op QNN added: no source node
            key = f"{node}#{m.group('op_id')}"
            current.node_cycles[key] = current.node_cycles.get(key, 0) + int(number)
        elif level == "ROOT" and ident in ("Accelerator (execute) time", "QNN (execute) time"):
            if current is None:  # profiling_level=basic: no cycles row opens the execution
                current = Execution()
                executions.append(current)
            if ident == "QNN (execute) time":
                current.qnn_execute_us = _us(number, unit)
                current = None
            else:
                current.accelerator_us = _us(number, unit)
        elif level == "ROOT" and unit in ("US", "MS", "NS"):
            events.setdefault(ident, _us(number, unit))
    if not executions:
        raise ProfileFormatError(f"{path}: a QNN profile with no execute events (was a graph executed "
                                 "while profiling?)")
    return QnnProfile(path, executions, events)


def _us(value: float, unit: str) -> float:
    return value * {"US": 1.0, "MS": 1000.0, "NS": 0.001}.get(unit, 1.0)


def base_node_name(node: str) -> str:
    """Return the ONNX node a profiled op came from ('conv1_token_1' -> 'conv1')."""
    m = _TOKEN.match(node)
    return m.group("base") if m else node


def guess_op_type(node: str, op_types: dict[str, str] | None = None) -> str:
    """Return the op type of a profiled op: from op_types (ONNX node name -> op type) when it names
    the op's source node, else 'Input'/'Output' for the graph's I/O ops, else QNN_INTERNAL for an
    op that names no node ('OpId_69'), else a CamelCase token of the name (the QNN EP names inserted
    ops after their type, e.g. 'Transpose_token_16'), else ''."""
    base = base_node_name(node)
    if op_types and base in op_types:
        return op_types[base]
    if node in ("Input", "Output"):
        return node
    if _UNNAMED.match(node):
        return QNN_INTERNAL
    for token in reversed(base.split("_")):
        if token[:1].isupper() and token.isalnum():
            return token
    return ""


def op_table(profile: QnnProfile, op_types: dict[str, str] | None = None) -> list[OpRow]:
    """Return one row per profiled HTP op, by median cycles per execution, largest first.

    Raises ProfileFormatError when the profile has no per-op rows (not 'detailed').
    """
    if not profile.has_node_rows:
        raise ProfileFormatError(f"{profile.path}: no per-op (NODE) rows: profile with profiling_level=detailed")
    keys: dict[str, None] = {}
    for e in profile.executions:
        keys.update(dict.fromkeys(e.node_cycles))
    medians = {k: int(statistics.median(e.node_cycles[k] for e in profile.executions if k in e.node_cycles))
               for k in keys}
    total = sum(medians.values())
    rows, running = [], 0
    for key, cycles in sorted(medians.items(), key=lambda kv: -kv[1]):
        node, op_id = key.rsplit("#", 1)
        running += cycles
        rows.append(OpRow(node, guess_op_type(node, op_types), int(op_id), cycles,
                          cycles / total if total else 0.0, running / total if total else 0.0))
    return rows


def median_execute(profile: QnnProfile) -> dict[str, float | None]:
    """Return the median accelerator cycles, accelerator µs and QNN execute µs per execution."""
    def med(values):
        values = [v for v in values if v is not None]
        return float(statistics.median(values)) if values else None

    return {"accelerator_cycles": med(e.accelerator_cycles for e in profile.executions),
            "accelerator_us": med(e.accelerator_us for e in profile.executions),
            "qnn_execute_us": med(e.qnn_execute_us for e in profile.executions)}
