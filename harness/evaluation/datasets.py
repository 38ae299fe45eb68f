"""Labelled evaluation data: a folder of samples and a CSV `file,label` naming each sample file and its label.

A sample file is a .npy (single-input models) or an .npz keyed by input name, holding one sample (the input's
shape, or (1, *shape)). Every row must name a file of the folder, every sample file of the folder must have a
row, and every label must read as the metric reads it; each error names the CSV file and line, or the folder
and the files.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from harness.data import Feed, InputInfo, load_feeds_file
from harness.errors import EvaluationError
from harness.evaluation.spec import Evaluation
from harness.evaluation.task import TaskEvaluation

SAMPLE_SUFFIXES = (".npy", ".npz")
HEADER = ["file", "label"]


@dataclass(frozen=True)
class LabelRow:
    """One line of a labels CSV: the sample file named, its label as written, and the line number."""

    file: str
    label: str
    line: int


def read_labels(path: Path) -> list[LabelRow]:
    """Return the rows of a labels CSV (a first row `file,label` is a header); raises EvaluationError naming
    the file and line of a row without exactly two fields or a file labelled twice."""
    rows: list[LabelRow] = []
    seen: dict[str, int] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EvaluationError(f"labels {path}: cannot read: {e}") from None
    for line, fields in enumerate(csv.reader(text.splitlines()), start=1):
        if not fields or (line == 1 and [f.strip().lower() for f in fields] == HEADER):
            continue
        if len(fields) != 2:
            raise EvaluationError(f"labels {path}, line {line}: expected 2 fields (file,label; quote a label "
                                  f"holding a comma), got {len(fields)}: {','.join(fields)!r}")
        name = fields[0].strip()
        if name in seen:
            raise EvaluationError(f"labels {path}, line {line}: '{name}' is labelled twice (first on line "
                                  f"{seen[name]})")
        seen[name] = line
        rows.append(LabelRow(name, fields[1], line))
    if not rows:
        raise EvaluationError(f"labels {path}: no rows (expected file,label lines)")
    return rows


def labelled_samples(evaluation: Evaluation, infos: list[InputInfo]) -> tuple[list[Feed], list[str], TaskEvaluation]:
    """Return the evaluation's samples in the CSV's order, their labels (text) and the task evaluation; raises
    EvaluationError naming the file and line of a label that names no sample or does not parse, or the sample
    files that have no label."""
    rows = read_labels(evaluation.labels)
    task = TaskEvaluation.of(evaluation, tuple(r.file for r in rows))
    files = {p.name for p in evaluation.data.iterdir() if p.suffix in SAMPLE_SUFFIXES}
    unlabelled = sorted(files - {r.file for r in rows})
    if unlabelled:
        shown = ", ".join(unlabelled[:5]) + (f" and {len(unlabelled) - 5} more" if len(unlabelled) > 5 else "")
        raise EvaluationError(f"evaluation data {evaluation.data}: {len(unlabelled)} sample file(s) have no label "
                              f"in {evaluation.labels}: {shown}")
    feeds: list[Feed] = []
    for row in rows:
        where = f"labels {evaluation.labels}, line {row.line}"
        if row.file not in files:
            raise EvaluationError(f"{where}: '{row.file}' is not a sample file ({', '.join(SAMPLE_SUFFIXES)}) "
                                  f"in {evaluation.data}")
        held = load_feeds_file(evaluation.data / row.file, infos, what="evaluation sample")
        if len(held) != 1:
            raise EvaluationError(f"{where}: {row.file} holds {len(held)} samples; a labelled file holds one")
        for metric in (task.metric, *task.reported):
            try:
                metric.parse(row.label)
            except ValueError:
                raise EvaluationError(f"{where}: label {row.label!r} of {row.file} is not {metric.expects} "
                                      f"(metric {metric.name})") from None
        feeds.append(held[0])
    return feeds, [r.label for r in rows], task
