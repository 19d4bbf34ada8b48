"""Runs and their tokens, kept in SQLite in the state dir so restarts and several workers share them.

Only the SHA-256 of a token is stored; the token itself exists once, in the mint reply.
"""

import hashlib
import secrets
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path

from egressd.injection import new_placeholder
from egressd.reasons import Reason

TOKEN_BYTES = 32  # 256 random bits

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    policy TEXT NOT NULL,
    version INTEGER NOT NULL,
    policy_sha256 TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    revoked_at REAL,
    expiry_recorded INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS run_placeholders (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    name TEXT NOT NULL,
    placeholder TEXT NOT NULL UNIQUE,
    injected INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, name)
);
"""


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    policy: str
    version: int
    policy_sha256: str
    label: str
    created_at: float
    expires_at: float
    revoked_at: float | None

    def refusal(self, now: float) -> Reason | None:
        """Why this run's token no longer opens anything, or None while it is live."""
        if self.revoked_at is not None:
            return Reason.TOKEN_REVOKED
        if now >= self.expires_at:
            return Reason.TOKEN_EXPIRED
        return None

    def summary(self, now: float) -> dict[str, object]:
        """The run as `token list` shows it: never the token."""
        return {
            "run_id": self.run_id,
            "policy": self.policy,
            "version": self.version,
            "policy_sha256": self.policy_sha256,
            "label": self.label,
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.expires_at),
            "revoked_at": rfc3339(self.revoked_at) if self.revoked_at is not None else None,
            "state": {None: "active", Reason.TOKEN_REVOKED: "revoked", Reason.TOKEN_EXPIRED: "expired"}[
                self.refusal(now)
            ],
        }


_COLUMNS = "run_id, policy, version, policy_sha256, label, created_at, expires_at, revoked_at"


class RunStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        path.chmod(0o600)

    def close(self) -> None:
        self._db.close()

    def mint(self, policy: str, version: int, policy_sha256: str, ttl: float, label: str,
             secret_names: Iterable[str] = ()) -> tuple[Run, str, dict[str, str]]:
        """A new run, its token (the only time it exists outside the client) and a placeholder per secret."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        now = time.time()
        run = Run(f"run_{secrets.token_hex(8)}", policy, version, policy_sha256, label, now, now + ttl, None)
        placeholders = {name: new_placeholder() for name in secret_names}
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                f"INSERT INTO runs ({_COLUMNS}, token_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (*astuple(run), token_digest(token)),
            )
            self._db.executemany(
                "INSERT INTO run_placeholders (run_id, name, placeholder) VALUES (?, ?, ?)",
                [(run.run_id, name, placeholder) for name, placeholder in placeholders.items()],
            )
        return run, token, placeholders

    def placeholders(self, run_id: str) -> dict[str, str]:
        """name → placeholder of a run's secrets."""
        rows = self._db.execute("SELECT name, placeholder FROM run_placeholders WHERE run_id = ?", (run_id,))
        return dict(rows.fetchall())

    def mark_injected(self, run_id: str, names: Iterable[str]) -> None:
        self._db.executemany("UPDATE run_placeholders SET injected = 1 WHERE run_id = ? AND name = ?",
                             [(run_id, name) for name in names])

    def injected(self, run_id: str) -> set[str]:
        """The secrets egressd has sent on this run's behalf: their values are scrubbed from its replies."""
        rows = self._db.execute("SELECT name FROM run_placeholders WHERE run_id = ? AND injected = 1", (run_id,))
        return {name for (name,) in rows.fetchall()}

    def by_token(self, token: str) -> Run | None:
        return self._one("token_sha256 = ?", token_digest(token))

    def get(self, run_id: str) -> Run | None:
        return self._one("run_id = ?", run_id)

    def revoke(self, run_id: str) -> Run | None:
        """Revokes a live run; returns it (revoked), or None when there is no such run."""
        self._db.execute(
            "UPDATE runs SET revoked_at = ? WHERE run_id = ? AND revoked_at IS NULL", (time.time(), run_id)
        )
        return self.get(run_id)

    def all(self) -> list[Run]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM runs ORDER BY created_at").fetchall()  # noqa: S608
        return [Run(*row) for row in rows]

    def count_active(self, now: float) -> int:
        row = self._db.execute(
            "SELECT COUNT(*) FROM runs WHERE revoked_at IS NULL AND expires_at > ?", (now,)
        ).fetchone()
        return int(row[0])

    def refused_among(self, run_ids: Iterable[str], now: float) -> dict[str, Reason]:
        """Of these runs, the ones that must lose their tunnels now (revoked, expired or deleted)."""
        wanted = list(set(run_ids))
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM runs WHERE run_id IN ({marks})", wanted  # noqa: S608
        ).fetchall()
        found = {row[0]: Run(*row) for row in rows}
        refused = {run_id: Reason.TOKEN_REVOKED for run_id in wanted if run_id not in found}
        for run in found.values():
            reason = run.refusal(now)
            if reason is not None:
                refused[run.run_id] = reason
        return refused

    def claim_expired(self, now: float) -> list[Run]:
        """Runs that expired since the last call, each returned once across every worker sharing the store."""
        claimed = []
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM runs WHERE expiry_recorded = 0 AND revoked_at IS NULL AND expires_at <= ?",  # noqa: S608
            (now,),
        ).fetchall()
        for row in rows:
            cursor = self._db.execute(
                "UPDATE runs SET expiry_recorded = 1 WHERE run_id = ? AND expiry_recorded = 0", (row[0],)
            )
            if cursor.rowcount == 1:
                claimed.append(Run(*row))
        return claimed

    def _one(self, where: str, value: str) -> Run | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM runs WHERE {where}", (value,)).fetchone()  # noqa: S608
        return Run(*row) if row else None

