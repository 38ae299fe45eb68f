"""The results database's tables as this harness reads and writes them (schema version SCHEMA_VERSION; the
numbered steps in harness.history.migrations build them).

    runs          one pytest session: uid (its key in spools), harness_run (harness.farm.identity.run_id),
                  started_at / finished_at (ISO 8601 UTC), duration_s, exit_status (NULL: unfinished or killed),
                  host, git_commit / git_branch (of the model's repository), ci_name / ci_job / ci_url (the CI
                  job, as the Allure executor reads it), environment and toolchain (JSON)
    run_models    the run's models: content digest, kind, source, spec (JSON), git commit / branch / repository
    run_devices   the run's devices at its end: SoC, transport, farm status and why, health (JSON)
    records       one step test's StepRecord: device, soc, model, step, pytest nodeid (unique per run with
                  them, so that a replay never writes a record twice), outcome, headline, message, marginal
                  and kpis (JSON, exactly as --kpi-json writes them), finished_at
    kpi_values    each numeric KPI of a record (nested ones as `a.b`) with its interval: a KPI's series per
                  device x model x step over runs
    tags          a name for a run (`python -m harness history tag RUN NAME`), one run per name
    schema_version  one row per migration applied
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# ISO 8601 UTC texts sort in time order on every database
_TIME = sa.String(40)

schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("applied_at", _TIME, nullable=False),
)

runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uid", sa.String(32), nullable=False, unique=True),
    sa.Column("harness_run", sa.String(64), nullable=False),
    sa.Column("started_at", _TIME, nullable=False, index=True),
    sa.Column("finished_at", _TIME),
    sa.Column("duration_s", sa.Double),
    sa.Column("exit_status", sa.Integer),
    sa.Column("host", sa.String(255)),
    sa.Column("git_commit", sa.String(64), index=True),
    sa.Column("git_branch", sa.String(255)),
    sa.Column("ci_name", sa.String(255)),
    sa.Column("ci_job", sa.String(255)),
    sa.Column("ci_url", sa.Text),
    sa.Column("environment", sa.Text),
    sa.Column("toolchain", sa.Text),
)

run_models = sa.Table(
    "run_models", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("model", sa.String(255), primary_key=True),
    sa.Column("digest", sa.String(80)),
    sa.Column("kind", sa.String(16)),
    sa.Column("source", sa.Text),
    sa.Column("spec", sa.Text),
    sa.Column("git_commit", sa.String(64)),
    sa.Column("git_branch", sa.String(255)),
    sa.Column("git_repository", sa.Text),
)

run_devices = sa.Table(
    "run_devices", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("device", sa.String(255), primary_key=True),
    sa.Column("soc", sa.String(64)),
    sa.Column("transport", sa.String(32)),
    sa.Column("status", sa.String(16)),
    sa.Column("reason", sa.Text),
    sa.Column("since", _TIME),
    sa.Column("expires", _TIME),
    sa.Column("health", sa.Text),
)

records = sa.Table(
    "records", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("device", sa.String(255), nullable=False),
    sa.Column("soc", sa.String(64), nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("step", sa.String(64), nullable=False),
    sa.Column("nodeid", sa.Text, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("headline", sa.Text),
    sa.Column("message", sa.Text),
    sa.Column("marginal", sa.Text),
    sa.Column("kpis", sa.Text),
    sa.Column("finished_at", _TIME),
    sa.UniqueConstraint("run_id", "device", "model", "step", "nodeid", name="records_key"),
    sa.Index("records_series", "device", "model", "step"),
)

kpi_values = sa.Table(
    "kpi_values", metadata,
    sa.Column("record_id", sa.Integer, sa.ForeignKey("records.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("value", sa.Double, nullable=False),
    sa.Column("low", sa.Double),
    sa.Column("high", sa.Double),
    sa.Column("confidence", sa.Double),
    sa.Column("samples", sa.Integer),
    sa.Column("method", sa.String(32)),
)

tags = sa.Table(
    "tags", metadata,
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("tagged_at", _TIME, nullable=False),
)
