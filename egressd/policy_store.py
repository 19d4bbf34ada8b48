"""The loaded policy versions: read from the policies directory, all or nothing, and kept immutable.

The first time a (name, version) is loaded its canonical content is recorded in the state dir. A file that
later says something else under the same version is refused and the recorded content keeps serving: wider
access needs a new version.
"""

import logging
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from egressd.policy import Policy, PolicyError, parse_policy

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS policy_versions (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    canonical TEXT NOT NULL,
    first_loaded REAL NOT NULL,
    PRIMARY KEY (name, version)
);
"""


class PolicyLock:
    """The recorded content of every (name, version) ever loaded."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._db = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def recorded(self, policy: Policy) -> Policy | None:
        row = self._db.execute(
            "SELECT canonical FROM policy_versions WHERE name = ? AND version = ?", policy.key
        ).fetchone()
        return Policy.model_validate_json(row[0]) if row else None

    def record(self, policy: Policy) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO policy_versions (name, version, sha256, canonical, first_loaded)"
            " VALUES (?, ?, ?, ?, ?)",
            (*policy.key, policy.sha256, policy.model_dump_json(), time.time()),
        )


@dataclass(frozen=True)
class PolicySet:
    versions: dict[tuple[str, int], Policy] = field(default_factory=dict)

    def get(self, name: str, version: int | None = None) -> Policy | None:
        """A version of a policy; without a version, the highest loaded."""
        if version is not None:
            return self.versions.get((name, version))
        candidates = [policy for (n, _), policy in self.versions.items() if n == name]
        return max(candidates, key=lambda policy: policy.version, default=None)

    def __len__(self) -> int:
        return len(self.versions)


def read_policy_files(directory: Path) -> tuple[list[Policy], list[str]]:
    """Every *.toml in the directory, parsed; with one problem line per error ('file: field: why')."""
    policies: list[Policy] = []
    problems: list[str] = []
    if not directory.is_dir():
        return [], [f"{directory}: the policies directory does not exist"]
    try:
        files = sorted(directory.glob("*.toml"))
    except OSError as err:
        return [], [f"{directory}: cannot list policies: {err.strerror}"]
    seen: dict[tuple[str, int], Path] = {}
    for file in files:
        try:
            policy = parse_policy(file.read_text(encoding="utf-8"), str(file))
        except PolicyError as err:
            problems.append(str(err))
            continue
        except (OSError, UnicodeDecodeError) as err:
            problems.append(f"{file}: cannot read: {err}")
            continue
        if policy.key in seen:
            problems.append(f"{file}: {policy.label} is also defined in {seen[policy.key]}")
            continue
        seen[policy.key] = file
        policies.append(policy)
    return policies, problems


class PolicyStore:
    def __init__(self, directory: Path, lock: PolicyLock) -> None:
        self.directory = directory
        self._lock = lock
        self.current = PolicySet()

    def reload(self) -> list[str]:
        """Loads every file; returns the problems. With any problem nothing changes, except on the first load,
        where versions whose files changed serve their recorded content (the rest must all parse)."""
        policies, problems = read_policy_files(self.directory)
        if problems:
            return problems
        versions: dict[tuple[str, int], Policy] = {}
        for policy in policies:
            recorded = self._lock.recorded(policy)
            if recorded is not None and recorded.sha256 != policy.sha256:
                problems.append(
                    f"{self.directory}: {policy.label} changed since it was first loaded "
                    f"(sha256 {recorded.sha256[:12]}… → {policy.sha256[:12]}…); versions are immutable, "
                    "publish the change as a new version"
                )
                versions[policy.key] = recorded
            else:
                versions[policy.key] = policy
        if problems and self.current.versions:
            return problems
        for policy in versions.values():
            self._lock.record(policy)
        self.current = PolicySet(versions)
        return problems
