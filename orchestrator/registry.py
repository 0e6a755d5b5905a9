"""The job registry: jobs, attempts and state transitions in SQLite under $FTORCH_HOME.

Several processes use it at once (the CLI, one supervisor per job), so every write is a short
transaction and the database runs in WAL mode. Files are readable by the owner only.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.home import ftorch_home  # noqa: F401 - re-exported: callers import it from here
from orchestrator.records import ATTEMPT_COLUMNS, JOB_COLUMNS, Attempt, Job, job_from_values
from orchestrator.states import ACTIVE, RESUMABLE, TERMINAL, JobState, Outcome

__all__ = ["ACTIVE", "RESUMABLE", "STATES", "TERMINAL", "Attempt", "Job", "JobState", "Outcome", "Registry"]

STATES = tuple(JobState)  # kept for callers that list the states

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    backend TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    run_uri TEXT NOT NULL,
    output_uri TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ended_at REAL,
    supervisor_pid INTEGER,
    supervisor_started REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    backend_job_id TEXT,
    hourly_usd REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    pid INTEGER,
    exit_code INTEGER,
    end_reason TEXT,
    start_step INTEGER,
    end_step INTEGER,
    first_step_at REAL,
    instance TEXT,
    spot INTEGER,
    hourly_usd REAL NOT NULL DEFAULT 0,
    outcome TEXT,
    PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS events_job ON events (job_id, at);
CREATE TABLE IF NOT EXISTS measurements (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    row_json TEXT NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS groups (
    job_id TEXT PRIMARY KEY,
    group_id TEXT NOT NULL,
    budget_usd REAL,
    point_json TEXT NOT NULL
);
"""
#: columns added after the first release: (table, column, type); added to older registries on open
MIGRATIONS = (("attempts", "outcome", "TEXT"),)


def busy_timeout_s() -> float:
    """How long a write waits for another process's lock before failing (FTORCH_REGISTRY_BUSY_S)."""
    return float(os.environ.get("FTORCH_REGISTRY_BUSY_S") or 30.0)


def is_busy(exc: BaseException) -> bool:
    """SQLite gave up waiting for another process's lock."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


class Registry:
    def __init__(self, home: Path | None = None) -> None:
        self.home = home or ftorch_home()
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        self.path = self.home / "registry.db"
        fresh = not self.path.exists()
        try:
            with self._connect() as db:
                db.executescript(SCHEMA)
                for table, column, kind in MIGRATIONS:
                    have = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
                    if column not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            raise UserError(
                f"the job registry {self.path} is unreadable ({exc}); move it aside to start a new one "
                f"(mv {self.path} {self.path}.bad); run stores and checkpoints are not affected"
            ) from None
        if fresh:
            os.chmod(self.path, 0o600)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        old = os.umask(0o077)
        busy_s = busy_timeout_s()
        try:
            db = sqlite3.connect(self.path, timeout=busy_s, isolation_level=None)
        finally:
            os.umask(old)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")
            db.row_factory = sqlite3.Row
            yield db
        finally:
            db.close()

    def job_dir(self, job_id: str) -> Path:
        path = self.home / "jobs" / job_id
        path.mkdir(parents=True, exist_ok=True, mode=0o700)  # `mode` is not given to the parents
        for folder in (path.parent, path):  # owner-only whatever the umask (or an older ftorch) made them
            os.chmod(folder, 0o700)
        return path

    # ---- jobs ----------------------------------------------------------------------------------
    def create_job(
        self,
        job_id: str,
        name: str,
        backend: str,
        run_uri: str,
        output_uri: str,
        spec: dict[str, Any],
        hourly_usd: float = 0.0,
        created_at: float | None = None,
    ) -> Job:
        """A new PENDING job; `created_at` (default now) is the run's own when it is adopted from its store."""
        now = time.time()
        with self._connect() as db:
            db.execute(
                "INSERT INTO jobs (job_id, name, backend, state, run_uri, output_uri, spec_json, created_at,"
                " updated_at, hourly_usd) VALUES (?, ?, ?, 'PENDING', ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    name,
                    backend,
                    run_uri,
                    output_uri,
                    json.dumps(spec),
                    created_at or now,
                    now,
                    hourly_usd,
                ),
            )
            db.execute(
                "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, 'state', 'PENDING')",
                (job_id, now),
            )
        return self.get(job_id)

    def adopt_job(
        self,
        job: dict[str, Any],
        state: JobState,
        reason: str,
        attempts: list[dict[str, Any]],
        events: list[tuple[str, str | None]],
    ) -> Job:
        """Register a job adopted from its run store in one transaction (orchestrator/jobs/adopt.py): `job` is
        create_job's arguments; it appears with its state, attempts and events, or (killed part way) not
        at all, so a second attach completes what the first began."""
        now = time.time()
        ended = now if state in TERMINAL else None
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT INTO jobs (job_id, name, backend, state, reason, run_uri, output_uri, spec_json,"
                    " created_at, updated_at, ended_at, hourly_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job["job_id"], job["name"], job["backend"], str(state), reason, job["run_uri"],
                        job["output_uri"], json.dumps(job["spec"]), job.get("created_at") or now, now, ended,
                        job.get("hourly_usd") or 0.0,
                    ),
                )  # fmt: skip
                from trainer.faults import maybe_die

                maybe_die("attach", 1)  # tests: a kill inside the transaction leaves nothing registered
                for n, fields in enumerate(attempts, start=1):
                    db.execute(
                        "INSERT INTO attempts (job_id, n, started_at, instance, hourly_usd, ended_at,"
                        " end_reason, end_step, outcome) VALUES (?, ?, ?, 'adopted', 0.0, ?, ?, ?, ?)",
                        (
                            job["job_id"], n, fields.get("started_at") or now, fields.get("ended_at"),
                            fields.get("end_reason"), fields.get("end_step"), fields.get("outcome"),
                        ),
                    )  # fmt: skip
                detail = f"{state}: {reason}"
                for kind, text in [("state", detail), *events]:
                    db.execute(
                        "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                        (job["job_id"], now, kind, text),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return self.get(job["job_id"])

    def get(self, job_id: str) -> Job:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        return _job(row)

    def find(self, prefix: str) -> list[Job]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT * FROM jobs WHERE job_id = ? OR job_id LIKE ? ESCAPE '\\' ORDER BY created_at",
                (prefix, _like_prefix(prefix)),
            ).fetchall()
        exact = [r for r in rows if r["job_id"] == prefix]
        return [_job(r) for r in (exact or rows)]

    def lookup(self, job_ref: str) -> Job:
        """The one job an id or a unique id prefix names; a one-line UserError otherwise."""
        matches = self.find(job_ref)
        if not matches:
            raise UserError(f"JOB: no job {job_ref!r}; `ftorch status` lists the jobs")
        if len(matches) > 1:
            raise UserError(
                f"JOB: {job_ref!r} matches {len(matches)} jobs ({', '.join(j.job_id for j in matches[:4])});"
                " give more of the id"
            )
        return matches[0]

    def jobs(self) -> list[Job]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY created_at").fetchall()
        return [_job(r) for r in rows]

    def set_state(self, job_id: str, state: JobState | str, reason: str | None = None) -> None:
        state = JobState(state)
        now = time.time()
        ended = now if state in TERMINAL else None
        with self._connect() as db:
            db.execute(
                "UPDATE jobs SET state = ?, reason = ?, updated_at = ?, ended_at = ? WHERE job_id = ?",
                (state, reason, now, ended, job_id),
            )
            db.execute(
                "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, 'state', ?)",
                (job_id, now, state if reason is None else f"{state}: {reason}"),
            )

    def claim(
        self,
        job_id: str,
        from_states: tuple[str, ...],
        state: str,
        reason: str,
        pid: int,
        started: float | None,
    ) -> str | None:
        """Move a job from one of `from_states` to `state` and make `pid` its supervisor, atomically.

        Returns None on success, else the state the job was found in: of several commands racing to
        resume one job, exactly one wins."""
        now = time.time()
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None or row["state"] not in from_states:
                db.execute("ROLLBACK")
                return row["state"] if row is not None else "missing"
            db.execute(
                "UPDATE jobs SET state = ?, reason = ?, updated_at = ?, ended_at = NULL, supervisor_pid = ?,"
                " supervisor_started = ? WHERE job_id = ?",
                (state, reason, now, pid, started, job_id),
            )
            db.execute(
                "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, 'state', ?)",
                (job_id, now, f"{state}: {reason}"),
            )
            db.execute("COMMIT")
        return None

    def update(self, job_id: str, **fields: Any) -> None:
        allowed = {
            "supervisor_pid",
            "supervisor_started",
            "cancel_requested",
            "backend_job_id",
            "spec_json",
            "hourly_usd",
            "output_uri",
            "reason",
        }
        assert set(fields) <= allowed, fields
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._connect() as db:
            db.execute(
                f"UPDATE jobs SET {sets}, updated_at = ? WHERE job_id = ?",
                (*fields.values(), time.time(), job_id),
            )

    def event(self, job_id: str, kind: str, detail: str | None = None, at: float | None = None) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                (job_id, at or time.time(), kind, detail),
            )

    def add_events(self, kind: str, details: dict[str, str]) -> None:
        """One `kind` event per job (job id -> detail), in one transaction."""
        if not details:
            return
        now = time.time()
        with self._connect() as db:
            db.executemany(
                "INSERT INTO events (job_id, at, kind, detail) VALUES (?, ?, ?, ?)",
                [(job_id, now, kind, detail) for job_id, detail in details.items()],
            )

    def events(self, job_id: str) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT at, kind, detail FROM events WHERE job_id = ? ORDER BY id", (job_id,)
            ).fetchall()
        return [dict(r) for r in rows]

    # ---- groups (a sweep's jobs: orchestrator/jobs/sweep.py) -------------------------------------------
    def join_group(self, job_id: str, group_id: str, budget_usd: float | None, point: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO groups (job_id, group_id, budget_usd, point_json) VALUES (?, ?, ?, ?)",
                (job_id, group_id, budget_usd, json.dumps(point)),
            )

    def groups(self) -> dict[str, dict[str, Any]]:
        """job id -> {group_id, budget_usd, point} for every job launched as part of a group."""
        with self._connect() as db:
            rows = db.execute("SELECT job_id, group_id, budget_usd, point_json FROM groups").fetchall()
        return {
            r["job_id"]: {
                "group_id": r["group_id"],
                "budget_usd": r["budget_usd"],
                "point": json.loads(r["point_json"]),
            }
            for r in rows
        }

    def snapshot(self, event_kind: str) -> tuple[list[Job], dict[str, list[Attempt]], dict[str, str]]:
        """All jobs, their attempts and each job's newest `event_kind` event detail, in one connection
        with plain tuples (fast enough to list thousands of jobs)."""
        attempts: dict[str, list[Attempt]] = {}
        details: dict[str, str] = {}
        with self._connect() as db:
            db.row_factory = None
            job_rows = db.execute(f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs ORDER BY created_at").fetchall()
            for row in db.execute(f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM attempts ORDER BY job_id, n"):
                attempts.setdefault(row[0], []).append(Attempt(*row))
            for job_id, detail in db.execute(
                "SELECT job_id, detail FROM events WHERE kind = ? ORDER BY id", (event_kind,)
            ):
                details[job_id] = detail
        return [job_from_values(row) for row in job_rows], attempts, details

    # ---- attempts ------------------------------------------------------------------------------
    def start_attempt(
        self,
        job_id: str,
        start_step: int | None,
        instance: str = "local",
        spot: bool | None = None,
        hourly_usd: float = 0.0,
    ) -> Attempt:
        now = time.time()
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            n = db.execute(
                "SELECT COALESCE(MAX(n), 0) + 1 FROM attempts WHERE job_id = ?", (job_id,)
            ).fetchone()[0]
            db.execute(
                "INSERT INTO attempts (job_id, n, started_at, start_step, instance, spot, hourly_usd)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, n, now, start_step, instance, None if spot is None else int(spot), hourly_usd),
            )
            db.execute("COMMIT")
        return Attempt(
            job_id, n, now, start_step=start_step, instance=instance, spot=spot, hourly_usd=hourly_usd
        )

    def update_attempt(self, job_id: str, n: int, **fields: Any) -> None:
        allowed = {
            "ended_at", "pid", "exit_code", "end_reason", "end_step", "first_step_at", "start_step", "outcome",
            "started_at",  # an attempt adopted from the run store's records (orchestrator/jobs/adopt.py)
        }  # fmt: skip
        assert set(fields) <= allowed, fields
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._connect() as db:
            db.execute(
                f"UPDATE attempts SET {sets} WHERE job_id = ? AND n = ?", (*fields.values(), job_id, n)
            )

    def attempts(self, job_id: str) -> list[Attempt]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", (job_id,)).fetchall()
        return [Attempt(**{c: r[c] for c in ATTEMPT_COLUMNS}) for r in rows]

    # ---- measurements (orchestrator/sizing/history.py) -------------------------------------------------
    def record_measurement(self, job_id: str, attempt: int, row: dict[str, Any]) -> bool:
        """Keep what an attempt measured (once per job and attempt); False when it was already kept."""
        with self._connect() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO measurements (job_id, attempt, recorded_at, row_json) VALUES (?, ?, ?, ?)",
                (job_id, attempt, time.time(), json.dumps(row, sort_keys=True)),
            )
            return cursor.rowcount > 0

    def measurements(self) -> list[dict[str, Any]]:
        """Every kept measurement, oldest first (the row as recorded, with job_id, attempt, recorded_at)."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM measurements ORDER BY recorded_at, job_id, attempt").fetchall()
        return [
            {**json.loads(r["row_json"]), "job_id": r["job_id"], "attempt": r["attempt"],
             "recorded_at": r["recorded_at"]}
            for r in rows
        ]  # fmt: skip


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _job(row: sqlite3.Row) -> Job:
    return job_from_values(tuple(row[c] for c in JOB_COLUMNS))
