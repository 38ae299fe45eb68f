"""The run history (issue 40): migrations, the store's idempotent writes, the spool and its replay, a run recorded
by the plugin as --kpi-json records it, and `python -m harness history list|show|tag`."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.__main__ import main as harness_main
from harness.devices import load_devices_file
from harness.errors import ConfigError
from harness.history import schema
from harness.history.database import HistoryError, default_url, mask, url_key
from harness.history.identity import git_revision, run_event
from harness.history.migrations import SCHEMA_VERSION
from harness.history.recorder import Recorder
from harness.history.spool import SPOOL_DIR, Spool
from harness.history.store import ResultsStore
from harness.models import resolve_model
from harness.reporting.records import StepRecord
from harness.target import Target

REPO = Path(__file__).resolve().parent.parent
FEASIBILITY, CONVERSION = (str(REPO / "suites" / name) for name in ("test_01_feasibility.py", "test_02_conversion.py"))
KPIS = {"latency_ms": {"p50": 1.5, "p90": 2.0}, "htp_fraction": 1.0, "ok": True, "note": "text",
        "intervals": {"latency_ms.p50": {"low": 1.4, "high": 1.6, "samples": 5, "method": "repeats"}}}


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _run_start(uid: str, started_at: str = "2026-12-07T10:00:00+00:00", commit: str | None = None) -> dict:
    return {"event": "run", "uid": uid, "harness_run": "h-" + uid[:4], "started_at": started_at, "host": "bench",
            "git_commit": commit, "git_branch": "main" if commit else None, "environment": {"python": "3.11"},
            "toolchain": {"onnxruntime": "1.32.0"},
            "models": [{"model": "m", "digest": None, "kind": "onnx", "source": "/x/m.onnx", "spec": {"name": "m"}}]}


def _events(uid: str, steps=("feasibility", "conversion", "profile"), device: str = "phone") -> list[dict]:
    records = [{"event": "record", "run": uid, "nodeid": f"suites/t.py::test_{s}[{device}-m]",
                "record": StepRecord(device, "sm8650", "m", s, "failed" if s == "profile" else "passed", KPIS,
                                     "profile did not pass: latency 2 ms > 1 ms\ndetails" if s == "profile" else "")
                .to_json()} for s in steps]
    finish = {"event": "finish", "run": uid, "finished_at": "2026-12-07T10:01:00+00:00", "duration_s": 60.0,
              "exit_status": 1, "digests": {"m": "ab" * 32},
              "devices": [{"id": device, "soc": "sm8650", "transport": "emulator", "status": "healthy",
                           "health": {"free_mb": 100}}]}
    return [_run_start(uid), *records, finish]


@pytest.fixture
def filled(tmp_path) -> str:
    """A database holding two runs (uids 'a' * 32 on phone, 'b' * 32 on tablet), the second started later."""
    url = _url(tmp_path / "history.db")
    store = ResultsStore.open(url)
    store.apply_all(_events("a" * 32))
    store.apply_all([{**e, "started_at": "2026-12-08T10:00:00+00:00"} if e["event"] == "run" else e
                     for e in _events("b" * 32, device="tablet")])
    store.close()
    return url


# --------------------------------------------------------------------------- migrations


def test_migrations_create_the_schema_and_refuse_a_newer_one(tmp_path):
    url = _url(tmp_path / "h.db")
    ResultsStore.open(url).close()
    ResultsStore.open(url).close()  # at its version already: nothing applied twice
    engine = sa.create_engine(url)
    inspector = sa.inspect(engine)
    for table in schema.metadata.tables.values():  # the steps build the tables the code queries
        assert {c["name"] for c in inspector.get_columns(table.name)} == {c.name for c in table.columns}, table.name
    with engine.begin() as conn:
        assert conn.execute(sa.select(schema.schema_version.c.version)).scalars().all() == [SCHEMA_VERSION]
        conn.execute(schema.schema_version.insert().values(version=SCHEMA_VERSION + 1, description="from the future",
                                                          applied_at="2030-01-01T00:00:00+00:00"))
    engine.dispose()
    with pytest.raises(HistoryError) as refused:
        ResultsStore.open(url)
    message = str(refused.value)
    assert "\n" not in message and url in message
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this harness's {SCHEMA_VERSION}" in message
    assert mask("postgresql://ci:s3cret@db.lab:5432/history") == "postgresql://ci:***@db.lab:5432/history"
    with pytest.raises(ConfigError, match="SQLite or PostgreSQL, not mysql"):
        ResultsStore.open("mysql://u:pw@h/db")


# --------------------------------------------------------------------------- the store


def test_each_event_is_written_once_and_read_back(filled):
    store = ResultsStore.open(filled)
    try:
        counts = {t: store.count(t) for t in ("runs", "records", "kpi_values", "run_devices", "run_models")}
        # per record: latency_ms.p50, latency_ms.p90, htp_fraction (booleans and texts are no series)
        assert counts == {"runs": 2, "records": 6, "kpi_values": 18, "run_devices": 2, "run_models": 2}
        assert store.apply_all(_events("a" * 32)) == 0  # a replay: nothing written twice
        assert {t: store.count(t) for t in counts} == counts
        detail = store.show_run("aaaaaa")
        assert [(r.step, r.outcome, r.kpis) for r, _, _ in detail.records] == \
            [("feasibility", "passed", KPIS), ("conversion", "passed", KPIS), ("profile", "failed", KPIS)]
        assert detail.run["exit_status"] == 1 and detail.models[0]["digest"] == "ab" * 32
        assert detail.devices[0]["status"] == "healthy" and detail.devices[0]["health"] == {"free_mb": 100}
        assert [r.id for r in store.list_runs()] == [2, 1]  # newest first
        assert [r.id for r in store.list_runs(device="tablet")] == [2] and store.list_runs(model="other") == []
        assert store.list_runs(last=1)[0].outcomes == {"passed": 2, "failed": 1}
    finally:
        store.close()
    engine = sa.create_engine(filled)
    with engine.connect() as conn:
        p50 = conn.execute(sa.select(schema.kpi_values).where(schema.kpi_values.c.name == "latency_ms.p50")).first()
    engine.dispose()
    assert (p50.value, p50.low, p50.high, p50.samples, p50.method) == (1.5, 1.4, 1.6, 5, "repeats")


def test_a_spool_replays_once_skipping_a_cut_line_and_setting_aside_what_the_database_refuses(tmp_path):
    url = _url(tmp_path / "h.db")
    spool = Spool(tmp_path / "spool", url)
    start, *rest = _events("c" * 32)
    for event in rest:
        spool.append(start["uid"], event, header=start)
    with open(spool.path(start["uid"]), "a") as fh:
        fh.write('{"event": "record", "run": "cc')  # a writer killed mid-line
    orphan = Spool(tmp_path / "spool", url)
    orphan.path("d" * 32).write_text(json.dumps(rest[0] | {"run": "d" * 32}) + "\n")  # a record of no run
    saved = spool.path(start["uid"]).read_bytes()
    store = ResultsStore.open(url)
    try:
        refused = []
        assert spool.replay(store.apply_all, lambda path, e: refused.append(path.name)) == (1, 2 + 3 + 9 + 1)
        assert refused == ["d" * 32 + ".jsonl"] and spool.files() == []
        assert (spool.directory / ("d" * 32 + ".rejected")).exists()
        spool.path(start["uid"]).write_bytes(saved)  # replayed again: nothing written twice
        assert spool.replay(store.apply_all, lambda path, e: None) == (1, 0)
        assert (store.count("runs"), store.count("records")) == (1, 3)
    finally:
        store.close()


def test_a_model_in_a_git_work_tree_names_its_commit_and_branch_and_the_ci_job(tmp_path):
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "models"
    repo.mkdir()
    (repo / "tiny.onnx").write_bytes(b"not really onnx")
    for argv in (["init", "-q", "-b", "release"], ["add", "tiny.onnx"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "model"]):
        subprocess.run([git, "-C", str(repo), *argv], check=True, capture_output=True)
    head = subprocess.run([git, "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert git_revision(repo / "tiny.onnx") == (head, "release", str(repo.resolve()))
    assert git_revision(tmp_path) is None
    devices = load_devices_file(REPO / "devices.yaml")
    device = devices.select(["sm8650"])[0]
    target = Target(device, devices.soc(device.soc), resolve_model(str(repo / "tiny.onnx"), {}, None))
    from harness.cache import ArtifactCache

    event = run_event("run-7", "2026-12-07T10:00:00+00:00", [target], ArtifactCache(tmp_path / "cache"),
                      env={"GITHUB_RUN_ID": "99", "GITHUB_RUN_NUMBER": "12", "GITHUB_WORKFLOW": "nightly",
                           "GITHUB_REPOSITORY": "lab/models"})
    assert (event["git_commit"], event["git_branch"], event["ci_job"]) == (head, "release", "nightly #12")
    assert event["ci_url"] == "https://github.com/lab/models/actions/runs/99"
    model = event["models"][0]
    assert model["digest"] == hashlib.sha256(b"not really onnx").hexdigest()
    assert model["spec"]["name"] == "tiny" and model["git_repository"] == str(repo.resolve())


# --------------------------------------------------------------------------- runs of the plugin


def _records_of(url: str, harness_run: str) -> tuple[dict, list[dict], list[dict]]:
    """Return (the run's row, its records as --kpi-json writes them, its devices) of the one run of that id."""
    engine = sa.create_engine(url)  # the cache's database: other tests' runs are there too
    with engine.connect() as conn:
        runs = conn.execute(sa.select(schema.runs.c.id).where(schema.runs.c.harness_run == harness_run)).all()
    engine.dispose()
    assert len(runs) == 1, f"{len(runs)} runs of {harness_run}"
    store = ResultsStore.open(url, create=False)
    try:
        detail = store.show_run(str(runs[0].id))
    finally:
        store.close()
    return detail.run | {"models": detail.models}, [r.to_json() for r, _, _ in detail.records], detail.devices


def test_a_run_records_its_steps_and_devices_as_its_kpi_json(pytester, session_cache_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_RESULTS_DB", raising=False)  # the default: the cache's SQLite file
    run = f"history-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("HARNESS_RUN_ID", run)
    kpi = tmp_path / "kpi.json"
    result = pytester.runpytest_subprocess(FEASIBILITY, CONVERSION, "-p", "no:cacheprovider", "--device", "sm8650",
                                           "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi))
    result.assert_outcomes(passed=2)
    assert "ResultsDbWarning" not in result.stdout.str()
    row, records, devices = _records_of(default_url(session_cache_dir), run)
    written = json.loads(kpi.read_text())
    assert records == written["records"] and len(records) == 2  # KPIs, outcomes and messages round-trip
    assert [(d["device"], d["soc"], d["status"], d["reason"]) for d in devices] == \
        [(d["id"], d["soc"], d["status"], d["reason"]) for d in written["devices"]]
    assert row["exit_status"] == 0 and row["finished_at"] >= row["started_at"]
    assert row["environment"]["python"] == written["environment"]["python"] and row["toolchain"]["onnx"]
    assert row["models"][0]["model"] == "digits_cnn" and len(row["models"][0]["digest"]) == 64


def test_an_unreachable_database_spools_once_and_the_next_run_replays(pytester, session_cache_dir, tmp_path):
    url = _url(tmp_path / "not-yet" / "history.db")  # its folder does not exist: cannot be opened

    def run(name: str):
        kpi = tmp_path / f"{name}.json"
        result = pytester.runpytest_subprocess(FEASIBILITY, "-p", "no:cacheprovider", "--device", "sm8650",
                                               "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi),
                                               "--results-db", url)
        result.assert_outcomes(passed=1)
        return result.stdout.str(), json.loads(kpi.read_text())["records"]

    out, first = run("first")
    assert out.count("ResultsDbWarning: run history: results database") == 1, out[-3000:]
    assert f"{url} cannot be reached: unable to open database file" in out and "1 step record(s)" in out
    spool = session_cache_dir / SPOOL_DIR / url_key(url)
    spooled = list(spool.glob("*.jsonl"))
    assert len(spooled) == 1
    saved = spooled[0].read_bytes()
    (tmp_path / "not-yet").mkdir()
    out, second = run("second")
    assert "ResultsDbWarning" not in out and list(spool.glob("*.jsonl")) == []
    store = ResultsStore.open(url, create=False)
    try:
        counts = (store.count("runs"), store.count("records"), store.count("run_devices"))
        assert counts == (2, len(first) + len(second), 2)  # as two runs that reached it
        assert [r.exit_status for r in store.list_runs()] == [0, 0]
        # the spooled run is replayed before the second run's start is written
        assert [[r.to_json() for r, _, _ in store.show_run(n).records] for n in ("1", "2")] == [first, second]
        spooled[0].write_bytes(saved)  # the same spool replayed again writes nothing
        assert Spool(session_cache_dir / SPOOL_DIR, url).replay(store.apply_all, lambda p, e: None) == (1, 0)
        assert (store.count("runs"), store.count("records"), store.count("run_devices")) == counts
    finally:
        store.close()


def test_a_run_without_steps_writes_nothing_and_a_bad_url_is_refused_at_once(tmp_path):
    url = _url(tmp_path / "h.db")
    recorder = Recorder(url, tmp_path / "spool", lambda: pytest.fail("identified without a step"))
    recorder.finish("2026-12-07T10:00:00+00:00", 1.0, 0, [], {})
    recorder.close()
    assert not (tmp_path / "h.db").exists() and recorder.warning() is None
    with pytest.raises(ConfigError, match=r"--results-db 'not a url': not a database URL"):
        Recorder("not a url", tmp_path / "spool", dict)


# --------------------------------------------------------------------------- python -m harness history


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = harness_main(["history", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_history_list_show_and_tag(filled, capsys):
    code, out, _ = _cli(capsys, "--results-db", filled, "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["run", "started", "exit", "steps", "devices", "models", "commit",
                                              "branch", "ci", "job", "tags"]
    assert lines[2].split()[:6] == ["2", "2026-12-08", "10:00:00Z", "1", "2", "passed,"] and "tablet" in lines[2]
    assert _cli(capsys, "list", "--results-db", filled, "--device", "phone", "--last", "5")[1].count("phone") == 1
    assert _cli(capsys, "--results-db", filled, "list", "--model", "nope")[1].strip() == \
        f"no runs of model nope in {filled}"
    code, out, _ = _cli(capsys, "--results-db", filled, "tag", "1", "release-2026.12")
    assert (code, out.strip()) == (0, "tagged run 1 release-2026.12")
    code, out, _ = _cli(capsys, "--results-db", filled, "tag", "bbbbbbbb", "release-2026.12")
    assert out.strip() == "tagged run 2 release-2026.12 (moved from run 1)"
    code, out, _ = _cli(capsys, "--results-db", filled, "show", "release-2026.12")
    assert code == 0 and "run             2 (uid " + "b" * 32 + ")" in out
    assert "exit status     1" in out and "tags            release-2026.12" in out
    assert "tablet  m      profile      failed   4     profile did not pass: latency 2 ms > 1 ms" in out
    assert "details" not in out  # the headline, not the message's details


@pytest.mark.parametrize("argv, error", [
    (["show", "99"], "no run '99' in sqlite:///"),
    (["show", "zz-no-such-tag"], "no run 'zz-no-such-tag'"),
    (["tag", "1", "two words"], "tag 'two words': a tag is one word"),
])
def test_history_bad_input_is_one_line_and_exit_status_2(filled, capsys, argv, error):
    code, out, err = _cli(capsys, "--results-db", filled, *argv)
    assert (code, out) == (2, "") and err.startswith(f"history: {error}") and err.count("\n") == 1


def test_history_of_an_unreachable_or_unknown_database_is_one_line_and_exit_status_2(tmp_path, capsys):
    for url, error in [("sqlite:////nonexistent-dir/x.db", "results database sqlite:////nonexistent-dir/x.db: no "
                                                            "such file"),
                       (_url(tmp_path), "results database sqlite:///"),  # a directory, not a database file
                       ("mysql://u:pw@h/db", "--results-db mysql://u:***@h/db: the run history is kept in SQLite or "
                                             "PostgreSQL")]:
        code, out, err = _cli(capsys, "--results-db", url, "list")
        assert (code, out) == (2, "") and err.startswith(f"history: {error}") and err.count("\n") == 1, err
