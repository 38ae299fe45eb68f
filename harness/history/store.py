"""ResultsStore: one connection to the results database, written one short transaction per event (a run's
start, each step's record, its end) and read by `python -m harness history`.

Events are plain JSON objects (harness.history.identity.run_event, harness.history.recorder), so the ones that
could not be written are spooled as they are and replayed later through the same apply(): every write is an
INSERT ... ON CONFLICT DO NOTHING on the row's natural key (a run's uid; a record's run, device, model, step and
pytest nodeid), so a replayed event never writes a row twice."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError

from harness.clock import now_iso
from harness.history import schema
from harness.history.database import (HistoryError, RejectedEventsError, create_engine, mask, parse_url, reason,
                                      sqlite_file)
from harness.history.migrations import migrate
from harness.json_values import json_default
from harness.kpi import INTERVALS_KEY, interval_of
from harness.reasons import headline
from harness.reporting.records import RecordError, StepRecord

RUN_EVENT, RECORD_EVENT, FINISH_EVENT = "run", "record", "finish"
_UID_PREFIX = re.compile(r"[0-9a-f]{6,32}")


def to_json_text(value: Any) -> str:
    """Return value as the JSON text a column holds (numpy scalars and paths as --kpi-json writes them)."""
    return json.dumps(value, default=json_default, allow_nan=True)


def from_json_text(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class RunSummary:
    """One run as `history list` shows it."""

    id: int
    uid: str
    started_at: str
    exit_status: int | None
    git_commit: str | None
    git_branch: str | None
    ci_job: str | None
    host: str | None
    outcomes: dict[str, int] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunDetail:
    """One run as `history show` shows it: its row, models, devices, records (StepRecord with their nodeid and
    end time) and tags."""

    run: dict[str, Any]
    models: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    records: list[tuple[StepRecord, str, str | None]]
    tags: tuple[str, ...]


def kpi_rows(record_id: int, kpis: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the kpi_values rows of a record's KPIs: each finite number, and each of one level of nested
    ones as `kpi.key` (latency_ms.p50), with the interval the KPIs carry for it."""
    values: dict[str, float] = {}
    for key, value in kpis.items():
        if key == INTERVALS_KEY:
            continue
        if isinstance(value, dict):
            values.update({f"{key}.{k}": v for k, v in value.items() if _number(v)})
        elif _number(value):
            values[key] = value
    rows = []
    for name, value in values.items():
        i = interval_of(kpis, name)
        rows.append({"record_id": record_id, "name": name, "value": float(value), "low": i and i.low,
                     "high": i and i.high, "confidence": i and i.confidence, "samples": i and i.samples,
                     "method": i and i.method})
    return rows


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ResultsStore:
    """The results database at url, migrated to this harness's schema, on one connection."""

    def __init__(self, url: str, engine: sa.Engine, conn: sa.Connection) -> None:
        self.url = url
        self._engine = engine
        self._conn = conn
        self._run_ids: dict[str, int] = {}  # run uid -> runs.id

    @classmethod
    def open(cls, url: str, create: bool = True) -> ResultsStore:
        """Connect to url and migrate it. ConfigError for a URL that is not a database's; HistoryError when it
        cannot be reached, when create is False and its SQLite file does not exist, or when its schema is
        newer than this harness's."""
        file = sqlite_file(parse_url(url))
        if file is not None and not create and not file.is_file():
            raise HistoryError(f"results database {mask(url)}: no such file (a run writes it: pytest "
                               "--results-db URL)")
        engine = create_engine(url)
        try:
            conn = engine.connect()
        except SQLAlchemyError as e:
            engine.dispose()
            raise HistoryError(f"results database {mask(url)} cannot be reached: {reason(e)}") from None
        try:
            migrate(conn, url)
        except BaseException as e:
            conn.close()
            engine.dispose()
            if isinstance(e, SQLAlchemyError):
                raise HistoryError(f"results database {mask(url)}: cannot read or create its schema: "
                                   f"{reason(e)}") from None
            raise
        return cls(url, engine, conn)

    def close(self) -> None:
        try:
            self._conn.close()
        except SQLAlchemyError:
            pass  # a connection the server dropped: nothing to close
        self._engine.dispose()

    # ------------------------------------------------------------------------------------------ writes

    def apply(self, event: dict[str, Any]) -> int:
        """Write one event in its own transaction; return the rows it added (0: all there already)."""
        return self.apply_all([event])

    def apply_all(self, events: Iterable[dict[str, Any]]) -> int:
        """Write events in one transaction; return the rows they added. HistoryError when the database
        cannot be written (RejectedEventsError when it refused what they hold)."""
        try:
            with self._conn.begin():
                return sum(self._apply(event) for event in events)
        except (IntegrityError, DataError) as e:
            self._run_ids.clear()  # ids read in the rolled-back transaction may not exist
            raise RejectedEventsError(f"results database {mask(self.url)} refused a record: {reason(e)}") from None
        except (KeyError, RecordError) as e:  # a spooled event that is not one of ours
            self._run_ids.clear()
            raise RejectedEventsError(f"results database {mask(self.url)}: a malformed event ({e})") from None
        except SQLAlchemyError as e:
            self._run_ids.clear()
            raise HistoryError(f"results database {mask(self.url)} cannot be written: {reason(e)}") from None

    def _apply(self, event: dict[str, Any]) -> int:
        kind = event.get("event")
        if kind == RUN_EVENT:
            return self._begin_run(event)
        if kind == RECORD_EVENT:
            return self._record_step(event)
        if kind == FINISH_EVENT:
            return self._finish_run(event)
        raise RejectedEventsError(f"results database {mask(self.url)}: unknown event {kind!r}")

    def _insert_new(self, table: sa.Table, rows: Sequence[dict[str, Any]] | dict[str, Any],
                    keys: Sequence[str]) -> Any:
        """INSERT ... ON CONFLICT (keys) DO NOTHING, in the database's own dialect."""
        insert = postgresql.insert if self._conn.dialect.name == "postgresql" else sqlite.insert
        return insert(table).values(rows).on_conflict_do_nothing(index_elements=list(keys))

    def _run_id(self, uid: str) -> int:
        if uid not in self._run_ids:
            found = self._conn.execute(sa.select(schema.runs.c.id).where(schema.runs.c.uid == uid)).scalar()
            if found is None:
                raise RejectedEventsError(f"results database {mask(self.url)}: no run {uid} for a record "
                                          "(its run's start was never written)")
            self._run_ids[uid] = found
        return self._run_ids[uid]

    def _begin_run(self, ev: dict[str, Any]) -> int:
        row = {k: ev.get(k) for k in ("uid", "harness_run", "started_at", "host", "git_commit", "git_branch",
                                      "ci_name", "ci_job", "ci_url")}
        row |= {"environment": to_json_text(ev.get("environment") or {}),
                "toolchain": to_json_text(ev.get("toolchain") or {})}
        added = self._conn.execute(self._insert_new(schema.runs, row, ["uid"])).rowcount
        run_id = self._run_id(ev["uid"])
        models = [{"run_id": run_id, "model": m["model"], "digest": m.get("digest"), "kind": m.get("kind"),
                   "source": m.get("source"), "spec": to_json_text(m.get("spec") or {}),
                   "git_commit": m.get("git_commit"), "git_branch": m.get("git_branch"),
                   "git_repository": m.get("git_repository")} for m in ev.get("models") or []]
        if models:
            added += self._conn.execute(self._insert_new(schema.run_models, models, ["run_id", "model"])).rowcount
        return added

    def _record_step(self, ev: dict[str, Any]) -> int:
        record = StepRecord.from_json(ev["record"], f"the step record of {ev.get('nodeid')}")
        row = {"run_id": self._run_id(ev["run"]), "device": record.device, "soc": record.soc, "model": record.model,
               "step": record.step, "nodeid": ev.get("nodeid") or "", "outcome": record.outcome,
               "headline": headline(record.message), "message": record.message,
               "marginal": to_json_text(list(record.marginal)), "kpis": to_json_text(record.kpis),
               "finished_at": ev.get("finished_at")}
        stmt = self._insert_new(schema.records, row, ["run_id", "device", "model", "step", "nodeid"])
        record_id = self._conn.execute(stmt.returning(schema.records.c.id)).scalar()
        if record_id is None:  # written before (a replay)
            return 0
        values = kpi_rows(record_id, record.kpis)
        if values:
            self._conn.execute(schema.kpi_values.insert(), values)
        return 1 + len(values)

    def _finish_run(self, ev: dict[str, Any]) -> int:
        run_id = self._run_id(ev["run"])
        runs = schema.runs
        self._conn.execute(runs.update().where(runs.c.id == run_id).values(
            finished_at=ev.get("finished_at"), duration_s=ev.get("duration_s"), exit_status=ev.get("exit_status")))
        for model, digest in (ev.get("digests") or {}).items():
            if digest:
                m = schema.run_models
                self._conn.execute(m.update().where(m.c.run_id == run_id, m.c.model == model).values(digest=digest))
        devices = [{"run_id": run_id, "device": d["id"], "soc": d.get("soc"), "transport": d.get("transport"),
                    "status": d.get("status"), "reason": d.get("reason"), "since": d.get("since"),
                    "expires": d.get("expires"), "health": to_json_text(d.get("health"))}
                   for d in ev.get("devices") or []]
        added = 0
        if devices:
            added = self._conn.execute(self._insert_new(schema.run_devices, devices, ["run_id", "device"])).rowcount
        return added

    # ------------------------------------------------------------------------------------------ reads

    def _read(self, stmt: sa.Executable) -> list[sa.Row]:
        try:
            with self._conn.begin():
                return list(self._conn.execute(stmt))
        except SQLAlchemyError as e:
            raise HistoryError(f"results database {mask(self.url)} cannot be read: {reason(e)}") from None

    def count(self, table: str) -> int:
        """Return how many rows a table of the schema holds."""
        return self._read(sa.select(sa.func.count()).select_from(schema.metadata.tables[table]))[0][0]

    def list_runs(self, device: str | None = None, model: str | None = None, last: int = 20) -> list[RunSummary]:
        """Return the last runs, newest first: of device and of model when given."""
        runs, rec = schema.runs, schema.records
        query = sa.select(runs).order_by(runs.c.started_at.desc(), runs.c.id.desc()).limit(last)
        if device is not None:
            query = query.where(sa.or_(
                sa.exists().where(rec.c.run_id == runs.c.id, rec.c.device == device),
                sa.exists().where(schema.run_devices.c.run_id == runs.c.id, schema.run_devices.c.device == device)))
        if model is not None:
            query = query.where(sa.exists().where(schema.run_models.c.run_id == runs.c.id,
                                                  schema.run_models.c.model == model))
        rows = self._read(query)
        ids = [r.id for r in rows]
        outcomes: dict[int, dict[str, int]] = {i: {} for i in ids}
        for run_id, outcome, n in self._read(sa.select(rec.c.run_id, rec.c.outcome, sa.func.count())
                                             .where(rec.c.run_id.in_(ids)).group_by(rec.c.run_id, rec.c.outcome)):
            outcomes[run_id][outcome] = n
        devices = self._names(sa.union(sa.select(rec.c.run_id, rec.c.device),
                                       sa.select(schema.run_devices.c.run_id, schema.run_devices.c.device)), ids)
        models = self._names(sa.select(schema.run_models.c.run_id, schema.run_models.c.model), ids)
        tags = self._names(sa.select(schema.tags.c.run_id, schema.tags.c.name), ids)
        return [RunSummary(r.id, r.uid, r.started_at, r.exit_status, r.git_commit, r.git_branch, r.ci_job, r.host,
                           outcomes[r.id], devices.get(r.id, ()), models.get(r.id, ()), tags.get(r.id, ()))
                for r in rows]

    def _names(self, pairs: sa.Select | sa.CompoundSelect, ids: list[int]) -> dict[int, tuple[str, ...]]:
        """Return {run id: sorted names} of a (run_id, name) query, for the runs ids."""
        sub = pairs.subquery()
        found: dict[int, set[str]] = {}
        for run_id, name in self._read(sa.select(sub.c[0], sub.c[1]).where(sub.c[0].in_(ids))):
            found.setdefault(run_id, set()).add(name)
        return {k: tuple(sorted(v)) for k, v in found.items()}

    def resolve(self, ref: str) -> int:
        """Return the id of the run ref names: its number, a tag, or the start of its uid (6 hex digits or
        more). HistoryError when none or several match."""
        runs = schema.runs
        ref = ref.strip()
        if ref.isdigit():
            rows = self._read(sa.select(runs.c.id).where(runs.c.id == int(ref)))
        else:
            rows = self._read(sa.select(schema.tags.c.run_id).where(schema.tags.c.name == ref))
            if not rows and _UID_PREFIX.fullmatch(ref):
                rows = self._read(sa.select(runs.c.id).where(runs.c.uid.startswith(ref)).limit(2))
        if len(rows) > 1:
            raise HistoryError(f"run {ref!r} is ambiguous in {mask(self.url)}: give more of its uid, or its number")
        if not rows:
            raise HistoryError(f"no run {ref!r} in {mask(self.url)} (a run number, a tag or a uid prefix: "
                               "`python -m harness history list` shows them)")
        return rows[0][0]

    def show_run(self, ref: str) -> RunDetail:
        """Return the run ref names (see resolve) with its models, devices, records and tags."""
        run_id = self.resolve(ref)
        run = dict(self._read(sa.select(schema.runs).where(schema.runs.c.id == run_id))[0]._mapping)
        for key in ("environment", "toolchain"):
            run[key] = from_json_text(run[key]) or {}
        models, devices, rec = schema.run_models, schema.run_devices, schema.records
        model_rows = [dict(r._mapping) | {"spec": from_json_text(r.spec)} for r in self._read(
            sa.select(models).where(models.c.run_id == run_id).order_by(models.c.model))]
        device_rows = [dict(r._mapping) | {"health": from_json_text(r.health)} for r in self._read(
            sa.select(devices).where(devices.c.run_id == run_id).order_by(devices.c.device))]
        records = [(StepRecord(r.device, r.soc, r.model, r.step, r.outcome, from_json_text(r.kpis) or {},
                               r.message or "", tuple(from_json_text(r.marginal) or ())), r.nodeid, r.finished_at)
                   for r in self._read(sa.select(rec).where(rec.c.run_id == run_id).order_by(rec.c.id))]
        tags = tuple(sorted(r.name for r in self._read(sa.select(schema.tags.c.name)
                                                       .where(schema.tags.c.run_id == run_id))))
        return RunDetail(run, model_rows, device_rows, records, tags)

    def tag_run(self, ref: str, name: str) -> tuple[int, int | None]:
        """Give the run ref names the tag name (moved from the run that had it); return (its id, the run the
        tag was taken from or None)."""
        name = name.strip()
        if not name or any(c.isspace() for c in name) or name.isdigit():
            raise HistoryError(f"tag {name!r}: a tag is one word, not a number (e.g. release-2026.12)")
        run_id = self.resolve(ref)
        tags = schema.tags
        try:
            with self._conn.begin():
                before = self._conn.execute(sa.select(tags.c.run_id).where(tags.c.name == name)).scalar()
                if before is None:
                    self._conn.execute(tags.insert().values(name=name, run_id=run_id, tagged_at=now_iso()))
                elif before != run_id:
                    self._conn.execute(tags.update().where(tags.c.name == name)
                                       .values(run_id=run_id, tagged_at=now_iso()))
        except SQLAlchemyError as e:
            raise HistoryError(f"results database {mask(self.url)} cannot be written: {reason(e)}") from None
        return run_id, before if before != run_id else None
