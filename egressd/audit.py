"""The audit log: one JSON line per decision, appended with a single write so workers never interleave.

It never holds a token, a query string or a header value: callers pass only the fields below.
"""

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from egressd.runs import rfc3339

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Subject:
    """Who and where a decision is about: the tunnel's run and target, as far as they are known."""

    client: str | None = None
    run_id: str | None = None
    policy: str | None = None
    policy_version: int | None = None
    host: str | None = None
    port: int | None = None
    addr: str | None = None


# Told of every recorded decision (the metrics count them): event, decision, reason, subject, extra fields.
Observer = Callable[[str, str, str | None, Subject, dict[str, object]], None]


class AuditLog:
    def __init__(self, path: str, observer: Observer | None = None,
                 on_write_error: Callable[[], None] | None = None) -> None:
        """`path` is a file to append to, or "-" for stdout."""
        self.path = path
        self.write_errors = 0
        self._observer = observer
        self._on_write_error = on_write_error
        self._fd = -1
        self.reopen()

    def reopen(self) -> None:
        """Opens the file again by name: after logrotate moved it, lines go to the new file."""
        if self.path == "-":
            self._fd = sys.stdout.fileno()
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        old, self._fd = self._fd, fd
        if old >= 0:
            os.close(old)

    def close(self) -> None:
        if self.path != "-" and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def record(self, event: str, decision: str, reason: str | None, subject: Subject, **extra: object) -> None:
        line = {
            "ts": rfc3339(time.time()),
            "event": event,
            "decision": decision,
            "reason": reason,
            "run_id": subject.run_id,
            "policy": subject.policy,
            "policy_version": subject.policy_version,
            "client": subject.client,
            "host": subject.host,
            "port": subject.port,
            "addr": subject.addr,
            **extra,
        }
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as err:
            # An audit failure must be seen but must not take the gate down; metrics count these.
            self.write_errors += 1
            if self._on_write_error is not None:
                self._on_write_error()
            log.error("audit log %s: write failed: %s", self.path, err)
        if self._observer is not None:
            self._observer(event, decision, reason, subject, extra)
