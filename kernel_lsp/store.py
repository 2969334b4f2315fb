"""SQLite history: Tasks, Candidates, Evaluations and Searches.

One file per workspace, ``<root>/.kernel-lsp/store.sqlite``, in WAL mode so that
readers (the server, ``kernel-lsp report``) never block the one writer (a Search).
Every write is one transaction; the schema carries a version and migrates forward.

What is stored is exactly what the caller hands in: Candidate sources, Evaluation
messages, compiler logs, budgets. Nothing is scrubbed here. The engine keeps
secrets away from candidates (the Worker's environment is an allowlist), so an
Evaluation does not carry them; a caller that puts a secret in a note or a budget
will find it stored.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from kernel_lsp.model import Candidate, Evaluation, Task

STORE_DIR = ".kernel-lsp"
STORE_FILE = "store.sqlite"
SEARCH_STATES = ("running", "done", "cancelled", "failed")
# The parts of a baseline's key, one column each (engine/protocol.py BASELINE_PARTS).
BASELINE_COLUMNS = ("reference", "inputs", "gpu", "torch", "compile_mode", "method")


class StoreError(Exception):
    """The store cannot be opened or used."""


class SchemaTooNew(StoreError):
    """The file was written by a newer kernel-lsp than this one."""


# Each entry moves the schema from version i to i+1; never edit a shipped entry, append.
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE tasks (
            name TEXT PRIMARY KEY,
            reference_path TEXT NOT NULL,
            data TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL
        )""",
        """CREATE TABLE candidates (
            id TEXT PRIMARY KEY,
            task TEXT NOT NULL REFERENCES tasks(name),
            source TEXT NOT NULL,
            kind TEXT NOT NULL,
            origin TEXT NOT NULL,
            parent TEXT,
            note TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL
        )""",
        "CREATE INDEX candidates_task ON candidates(task, created)",
        """CREATE TABLE evaluations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            candidate TEXT NOT NULL REFERENCES candidates(id),
            task TEXT NOT NULL REFERENCES tasks(name),
            verdict TEXT NOT NULL,
            correct INTEGER,
            time_ms REAL,
            speedup_eager REAL,
            speedup_compile REAL,
            device TEXT,
            versions TEXT,
            data TEXT NOT NULL,
            created REAL NOT NULL
        )""",
        "CREATE INDEX evaluations_task ON evaluations(task, id)",
        "CREATE INDEX evaluations_candidate ON evaluations(candidate, id)",
        """CREATE TABLE searches (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task TEXT NOT NULL REFERENCES tasks(name),
            root TEXT REFERENCES candidates(id),
            proposer TEXT NOT NULL,
            budget TEXT NOT NULL DEFAULT '{}',
            state TEXT NOT NULL DEFAULT 'running'
                CHECK (state IN ('running', 'done', 'cancelled', 'failed')),
            best TEXT REFERENCES candidates(id),
            message TEXT NOT NULL DEFAULT '',
            started REAL NOT NULL,
            finished REAL
        )""",
        """CREATE TABLE search_nodes (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            search INTEGER NOT NULL REFERENCES searches(id) ON DELETE CASCADE,
            candidate TEXT NOT NULL REFERENCES candidates(id),
            parent TEXT,
            depth INTEGER NOT NULL DEFAULT 0,
            step INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL DEFAULT 'proposed',
            created REAL NOT NULL,
            UNIQUE (search, candidate)
        )""",
    ],
    [
        # Eager and torch.compile times kept per reference, inputs, GPU, torch, compile mode and
        # timing method (engine/protocol.py BASELINE_PARTS; the key hashes them all).
        """CREATE TABLE baselines (
            key TEXT PRIMARY KEY,
            reference TEXT NOT NULL,
            inputs TEXT NOT NULL,
            gpu TEXT NOT NULL,
            torch TEXT NOT NULL,
            compile_mode TEXT NOT NULL,
            method TEXT NOT NULL,
            data TEXT NOT NULL,
            measured REAL NOT NULL
        )""",
        "CREATE INDEX baselines_reference ON baselines(reference, measured)",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)


def store_path(root: str | os.PathLike[str]) -> Path:
    """The store file of a workspace root."""
    return Path(root) / STORE_DIR / STORE_FILE


class Store:
    """The history of one workspace. Safe to share between threads; each thread
    gets its own connection. Several processes may open the same file."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        p = Path(path)
        # A directory is a workspace root; anything else is the database file itself.
        if p.is_dir():
            p = store_path(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self._timeout = timeout
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._closed = False
        self._migrate()

    @classmethod
    def for_workspace(cls, root: str | os.PathLike[str]) -> "Store":
        return cls(store_path(root))

    # -- connections -------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("the store is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: we issue BEGIN ourselves, so a write is exactly one transaction.
            conn = sqlite3.connect(
                str(self.path), timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            self._set_wal(conn)
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _set_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a new file to WAL needs an exclusive lock and SQLite answers
        # "database is locked" at once, without the busy handler, while another
        # process does the same: retry until the store's own timeout.
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    class _Txn:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def __enter__(self) -> sqlite3.Connection:
            # IMMEDIATE takes the write lock up front: no deadlock on a read-then-write upgrade.
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, exc_type, exc, tb) -> None:
            if exc_type is None:
                self.conn.execute("COMMIT")
            else:
                self.conn.execute("ROLLBACK")

    def _write(self) -> "Store._Txn":
        return Store._Txn(self._conn())

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._conns.clear()
        self._closed = True

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ------------------------------------------------------------

    def _migrate(self) -> None:
        with self._write() as c:
            c.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = c.execute("SELECT version FROM schema_version").fetchone()
            version = row[0] if row else 0
            if row is None:
                c.execute("INSERT INTO schema_version (version) VALUES (0)")
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has store schema version {version}, but this kernel-lsp "
                    f"knows only up to {SCHEMA_VERSION}: upgrade kernel-lsp, or move the file away"
                )
            for i in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[i]:
                    c.execute(statement)
            c.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        return int(self._conn().execute("SELECT version FROM schema_version").fetchone()[0])

    # -- tasks and candidates ----------------------------------------------

    def add_task(self, task: Task) -> str:
        """Insert or update a Task; its id is its name."""
        now = time.time()
        with self._write() as c:
            c.execute(
                """INSERT INTO tasks (name, reference_path, data, created, updated)
                   VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT(name) DO UPDATE SET reference_path = excluded.reference_path,
                       data = excluded.data, updated = excluded.updated""",
                (task.name, task.reference_path, json.dumps(task.to_dict()), now, now),
            )
        return task.name

    def task(self, name: str) -> Task | None:
        row = self._conn().execute("SELECT data FROM tasks WHERE name = ?", (name,)).fetchone()
        return Task.from_dict(json.loads(row["data"])) if row else None

    def tasks(self) -> list[Task]:
        rows = self._conn().execute("SELECT data FROM tasks ORDER BY updated DESC").fetchall()
        return [Task.from_dict(json.loads(r["data"])) for r in rows]

    def _ensure_task(self, c: sqlite3.Connection, name: str) -> None:
        # An Evaluation may arrive for a task the caller never added: keep it (nothing is lost).
        now = time.time()
        c.execute(
            "INSERT OR IGNORE INTO tasks (name, reference_path, data, created, updated) VALUES (?, '', ?, ?, ?)",
            (name, json.dumps({"name": name, "reference_path": "", "reference_source": ""}), now, now),
        )

    def add_candidate(self, task_id: str, candidate: Candidate) -> str:
        """Insert a Candidate (idempotent: the id is its content hash)."""
        with self._write() as c:
            self._ensure_task(c, task_id)
            self._insert_candidate(c, task_id, candidate)
        return candidate.id

    def _insert_candidate(self, c: sqlite3.Connection, task_id: str, cand: Candidate) -> None:
        # A placeholder row (an Evaluation that came before its Candidate) gets the real text.
        c.execute(
            """INSERT INTO candidates (id, task, source, kind, origin, parent, note, created)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(id) DO UPDATE SET source = excluded.source, kind = excluded.kind,
                   origin = excluded.origin, parent = excluded.parent, note = excluded.note
               WHERE candidates.origin = 'unknown' AND candidates.source = ''""",
            (cand.id, task_id, cand.source, cand.kind, cand.origin, cand.parent, cand.note, time.time()),
        )

    def candidate(self, candidate_id: str) -> Candidate | None:
        row = self._conn().execute("SELECT * FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
        return _candidate(row) if row else None

    def candidates(self, task_name: str) -> list[Candidate]:
        rows = self._conn().execute(
            "SELECT * FROM candidates WHERE task = ? ORDER BY created DESC, rowid DESC", (task_name,)
        ).fetchall()
        return [_candidate(r) for r in rows]

    # -- evaluations -------------------------------------------------------

    def add_evaluation(self, task_id: str, evaluation: Evaluation, candidate: Candidate | None = None) -> int:
        """Record an Evaluation. When its Candidate is not stored yet, pass it (or a
        placeholder row keeps the foreign key: the Evaluation is never dropped)."""
        ev = evaluation
        with self._write() as c:
            self._ensure_task(c, task_id)
            if candidate is not None:
                self._insert_candidate(c, task_id, candidate)
            c.execute(
                """INSERT OR IGNORE INTO candidates (id, task, source, kind, origin, parent, note, created)
                   VALUES (?, ?, '', 'python', 'unknown', NULL, 'source not recorded', ?)""",
                (ev.candidate, task_id, time.time()),
            )
            cur = c.execute(
                """INSERT INTO evaluations (candidate, task, verdict, correct, time_ms, speedup_eager,
                       speedup_compile, device, versions, data, created)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    ev.candidate,
                    task_id,
                    ev.verdict,
                    None if ev.correct is None else int(ev.correct),
                    ev.time.median_ms if ev.time else None,
                    ev.speedup_eager,
                    ev.speedup_compile,
                    (ev.device or {}).get("name") if isinstance(ev.device, dict) else None,
                    json.dumps(ev.versions or {}),
                    json.dumps(ev.to_dict()),
                    time.time(),
                ),
            )
            return int(cur.lastrowid or 0)

    def record(self, task: Task, candidate: Candidate, evaluation: Evaluation) -> int:
        """The one call that records what running a Candidate gave: its Task, its text and the
        Evaluation (each write is idempotent or append-only). Every entry point (engine, agent,
        server, CLI) should record through here, once per Evaluation."""
        self.add_task(task)
        return self.add_evaluation(task.name, evaluation, candidate)

    def evaluations(
        self, task_name: str, candidate: str | None = None, limit: int | None = None
    ) -> list[Evaluation]:
        """Newest first."""
        sql = "SELECT data FROM evaluations WHERE task = ?"
        args: list[Any] = [task_name]
        if candidate is not None:
            sql += " AND candidate = ?"
            args.append(candidate)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        rows = self._conn().execute(sql, args).fetchall()
        return [Evaluation.from_dict(json.loads(r["data"])) for r in rows]

    def latest(self, task_name: str, candidate: str | None = None) -> Evaluation | None:
        evs = self.evaluations(task_name, candidate=candidate, limit=1)
        return evs[0] if evs else None

    def best(self, task_name: str) -> tuple[Candidate, Evaluation] | None:
        """The correct Evaluation with the lowest time for a task, and its Candidate."""
        row = self._conn().execute(
            """SELECT data FROM evaluations WHERE task = ? AND correct = 1 AND time_ms IS NOT NULL
               ORDER BY time_ms ASC, id DESC LIMIT 1""",
            (task_name,),
        ).fetchone()
        if row is None:
            return None
        ev = Evaluation.from_dict(json.loads(row["data"]))
        cand = self.candidate(ev.candidate)
        return (cand, ev) if cand is not None else None

    # -- baselines ---------------------------------------------------------

    def put_baseline(self, record: dict[str, Any]) -> str:
        """Keep one baseline measurement (a Worker's record: key, parts, eager, compiled,
        measured_at, ...); a newer one under the same key replaces the older."""
        parts = record.get("parts") or {}
        key = str(record.get("key") or "")
        missing = [p for p in BASELINE_COLUMNS if not str(parts.get(p) or "")]
        if not key or missing:
            raise StoreError(f"a baseline record needs a key and {', '.join(missing) or 'its parts'}")
        measured = float(record.get("measured_at") or time.time())
        with self._write() as c:
            c.execute(
                f"""INSERT INTO baselines (key, {', '.join(BASELINE_COLUMNS)}, data, measured)
                    VALUES (?, {', '.join('?' for _ in BASELINE_COLUMNS)}, ?, ?)
                    ON CONFLICT(key) DO UPDATE SET data = excluded.data, measured = excluded.measured""",
                (key, *(str(parts[p]) for p in BASELINE_COLUMNS), json.dumps(record), measured),
            )
        return key

    def baselines(self, reference: str) -> list[dict[str, Any]]:
        """The kept baselines of one reference (its source hash), newest first: every GPU,
        torch version, input shape and compile mode it was measured with."""
        rows = self._conn().execute(
            "SELECT data FROM baselines WHERE reference = ? ORDER BY measured DESC", (reference,)
        ).fetchall()
        return [json.loads(r["data"]) for r in rows]

    def baseline(self, key: str) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT data FROM baselines WHERE key = ?", (key,)).fetchone()
        return json.loads(row["data"]) if row else None

    # -- searches ----------------------------------------------------------

    def start_search(
        self,
        task_name: str,
        root_candidate: Candidate | str | None,
        proposer: str,
        budget: dict[str, Any] | None = None,
    ) -> int:
        root_id = root_candidate.id if isinstance(root_candidate, Candidate) else root_candidate
        with self._write() as c:
            self._ensure_task(c, task_name)
            if isinstance(root_candidate, Candidate):
                self._insert_candidate(c, task_name, root_candidate)
            cur = c.execute(
                "INSERT INTO searches (task, root, proposer, budget, state, started) VALUES (?, ?, ?, ?, 'running', ?)",
                (task_name, root_id, proposer, json.dumps(budget or {}), time.time()),
            )
            search_id = int(cur.lastrowid or 0)
            if root_id is not None:
                c.execute(
                    "INSERT OR IGNORE INTO search_nodes (search, candidate, parent, depth, step, status, created)"
                    " VALUES (?, ?, NULL, 0, 0, 'root', ?)",
                    (search_id, root_id, time.time()),
                )
        return search_id

    def add_node(
        self,
        search_id: int,
        candidate: Candidate | str,
        parent_id: str | None,
        depth: int,
        step: int = 0,
        status: str = "proposed",
    ) -> int:
        """Add a Candidate to a Search tree (a Candidate object is stored too)."""
        with self._write() as c:
            row = c.execute("SELECT task FROM searches WHERE id = ?", (search_id,)).fetchone()
            if row is None:
                raise StoreError(f"no search {search_id}")
            if isinstance(candidate, Candidate):
                self._insert_candidate(c, row["task"], candidate)
                cand_id = candidate.id
            else:
                cand_id = candidate
            cur = c.execute(
                """INSERT INTO search_nodes (search, candidate, parent, depth, step, status, created)
                   VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(search, candidate) DO UPDATE SET status = excluded.status""",
                (search_id, cand_id, parent_id, depth, step, status, time.time()),
            )
            return int(cur.lastrowid or 0)

    def update_node(self, search_id: int, candidate_id: str, status: str) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE search_nodes SET status = ? WHERE search = ? AND candidate = ?",
                (status, search_id, candidate_id),
            )

    def update_search(
        self,
        search_id: int,
        *,
        state: str | None = None,
        best: str | None = None,
        budget: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> None:
        if state is not None and state not in SEARCH_STATES:
            raise StoreError(f"unknown search state {state!r}; one of {SEARCH_STATES}")
        sets: list[str] = []
        args: list[Any] = []
        if state is not None:
            sets.append("state = ?")
            args.append(state)
            if state != "running":
                sets.append("finished = ?")
                args.append(time.time())
        if best is not None:
            sets.append("best = ?")
            args.append(best)
        if budget is not None:
            sets.append("budget = ?")
            args.append(json.dumps(budget))
        if message is not None:
            sets.append("message = ?")
            args.append(message)
        if not sets:
            return
        with self._write() as c:
            cur = c.execute(f"UPDATE searches SET {', '.join(sets)} WHERE id = ?", (*args, search_id))
            if cur.rowcount == 0:
                raise StoreError(f"no search {search_id}")

    def finish_search(
        self, search_id: int, state: str = "done", best: str | None = None, message: str | None = None
    ) -> None:
        self.update_search(search_id, state=state, best=best, message=message)

    def searches(self, task: str | None = None) -> list[dict[str, Any]]:
        """Searches, newest first, without their trees."""
        sql = "SELECT * FROM searches"
        args: tuple[Any, ...] = ()
        if task is not None:
            sql += " WHERE task = ?"
            args = (task,)
        rows = self._conn().execute(sql + " ORDER BY id DESC", args).fetchall()
        return [_search_row(r) for r in rows]

    def search(self, search_id: int) -> dict[str, Any] | None:
        """One Search: its row, every node (with the Candidate's latest Evaluation for
        the task), and ``tree``: nested from the root through ``children``."""
        conn = self._conn()
        row = conn.execute("SELECT * FROM searches WHERE id = ?", (search_id,)).fetchone()
        if row is None:
            return None
        out = _search_row(row)
        nodes_rows = conn.execute(
            """SELECT n.*, c.origin, c.note, c.kind,
                      (SELECT data FROM evaluations e WHERE e.candidate = n.candidate AND e.task = ?
                       ORDER BY e.id DESC LIMIT 1) AS evaluation
               FROM search_nodes n JOIN candidates c ON c.id = n.candidate
               WHERE n.search = ? ORDER BY n.step, n.id""",
            (row["task"], search_id),
        ).fetchall()
        nodes: dict[str, dict[str, Any]] = {}
        for r in nodes_rows:
            nodes[r["candidate"]] = {
                "candidate": r["candidate"],
                "parent": r["parent"],
                "depth": r["depth"],
                "step": r["step"],
                "status": r["status"],
                "origin": r["origin"],
                "note": r["note"],
                "kind": r["kind"],
                "evaluation": json.loads(r["evaluation"]) if r["evaluation"] else None,
                "children": [],
            }
        roots: list[dict[str, Any]] = []
        for node in nodes.values():
            parent = nodes.get(node["parent"]) if node["parent"] else None
            (parent["children"] if parent is not None else roots).append(node)
        out["nodes"] = list(nodes.values())
        out["tree"] = roots[0] if len(roots) == 1 else {"candidate": None, "children": roots}
        return out

    def search_evaluations(self, search_id: int) -> dict[str, list[dict[str, Any]]]:
        """One Search's own measurements: each of its Candidates' Evaluations recorded while it
        ran (from its start to its end, or to the next Search's start), oldest first. A later
        Search's re-timing of the same Candidate is not among them."""
        conn = self._conn()
        row = conn.execute("SELECT task, started, finished FROM searches WHERE id = ?", (search_id,)).fetchone()
        if row is None:
            return {}
        until = row["finished"]
        if until is None:
            nxt = conn.execute("SELECT MIN(started) AS t FROM searches WHERE task = ? AND started > ?",
                               (row["task"], row["started"])).fetchone()
            until = nxt["t"] if nxt is not None else None
        rows = conn.execute(
            """SELECT e.candidate, e.data FROM evaluations e
               JOIN search_nodes n ON n.candidate = e.candidate AND n.search = ?
               WHERE e.task = ? AND e.created >= ? AND (? IS NULL OR e.created <= ?)
               ORDER BY e.id""",
            (search_id, row["task"], row["started"], until, until),
        ).fetchall()
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(r["candidate"], []).append(json.loads(r["data"]))
        return out


def _candidate(row: sqlite3.Row) -> Candidate:
    return Candidate(
        source=row["source"],
        kind=row["kind"],
        origin=row["origin"],
        parent=row["parent"],
        note=row["note"],
    )


def _search_row(r: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": r["id"],
        "task": r["task"],
        "root": r["root"],
        "proposer": r["proposer"],
        "budget": json.loads(r["budget"] or "{}"),
        "state": r["state"],
        "best": r["best"],
        "message": r["message"],
        "started": r["started"],
        "finished": r["finished"],
    }
