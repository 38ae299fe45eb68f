"""`python -m harness profile-view`: the per-op table of a real QNN profile, and clear bad-input errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.steps.context_binary import compile_context
from harness.steps.profile import detailed_profile
from perf_helpers import random_feeds

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def profile_csv(qdq, cache, devices, sm8650_runner, tmp_path_factory):
    ctx = compile_context(qdq, devices.soc("sm8650"), cache)
    return detailed_profile(sm8650_runner, ctx.model, random_feeds(1)[0], tmp_path_factory.mktemp("prof")).path


def view(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "profile-view", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_prints_the_per_op_table_and_totals(profile_csv, qdq):
    proc = view(str(profile_csv), "--model", str(qdq))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    assert lines[header].split() == ["#", "node", "op", "type", "cycles", "share", "cum."]
    first = lines[header + 2].split()
    assert first[0] == "1" and first[-1].endswith("%")
    assert any(" Conv " in line for line in lines) and any(" Gemm " in line for line in lines)
    assert "total op cycles:" in proc.stdout and "accelerator execute time:" in proc.stdout
    assert lines[-1] != "" and "100.0%" in proc.stdout


def test_top_limits_the_rows(profile_csv):
    proc = view(str(profile_csv), "--top", "2")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line[:3].strip().isdigit()]
    assert [r.split()[0] for r in rows] == ["1", "2"] and "not shown" in proc.stdout


def test_ops_that_name_no_node_are_listed_as_qnn_internal(tmp_path):
    # rows as QNN writes them for ops it adds itself (e.g. inside a lowered If): 'OpId_69 (cycles)'
    header = "Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier\n"
    execution = ("0,EXECUTE,900,CYCLES,BACKEND,ROOT,Accelerator (execute) time (cycles)\n"
                 "0,NODE,100,CYCLES,BACKEND,SUB-EVENT,Input OpId_2 (cycles)\n"
                 "0,NODE,500,CYCLES,BACKEND,SUB-EVENT,conv1:OpId_16 (cycles)\n"
                 "0,NODE,250,CYCLES,BACKEND,SUB-EVENT,OpId_69 (cycles)\n"
                 "0,NODE,50,CYCLES,BACKEND,SUB-EVENT,OpId_70 (cycles)\n"
                 "0,EXECUTE,12,US,BACKEND,ROOT,Accelerator (execute) time\n"
                 "0,EXECUTE,20,US,BACKEND,ROOT,QNN (execute) time\n")
    path = tmp_path / "p.csv"
    path.write_text(header + execution * 3)
    proc = view(str(path))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line.split()[2:4] for line in proc.stdout.splitlines() if line[:3].strip().isdigit()}
    assert rows == {"conv1": ["?", "500"], "OpId_69": ["(qnn-internal)", "250"], "Input": ["Input", "100"],
                    "OpId_70": ["(qnn-internal)", "50"]}
    assert "QNN-internal ops (no source node, e.g. inside an If): 2, 300 cycles" in proc.stdout
    assert "total op cycles: 900" in proc.stdout


@pytest.mark.parametrize("content, message", [
    (None, "cannot read: No such file or directory"),
    ("a,b,c\n1,2,3\n", "not a QNN profile CSV"),
], ids=["missing", "not-a-profile"])
def test_bad_input_exits_2_without_a_traceback(tmp_path, content, message):
    path = tmp_path / "p.csv"
    if content is not None:
        path.write_text(content)
    proc = view(str(path))
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.startswith("profile-view: ")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
