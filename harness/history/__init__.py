"""The run history (issue 40): every session's step records, devices, environment and identity in a database
(SQLite by default, PostgreSQL for a farm), written as each step ends and spooled locally while the database
cannot be reached.

database: URLs and engines; schema: the tables; migrations: the numbered schema versions; store: the
ResultsStore that writes and reads them; spool: the local spool and its replay; identity: who a run is;
recorder: a run's writes to the store or the spool; cli: `python -m harness history`.
"""
