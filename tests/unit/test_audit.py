"""The audit log: one JSON line per decision with exactly the contract's fields, appended, reopenable."""

import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from egressd.audit import AuditLog, Subject

COMMON_FIELDS = {
    "ts",
    "event",
    "decision",
    "reason",
    "run_id",
    "policy",
    "policy_version",
    "client",
    "host",
    "port",
    "addr",
}
REQUEST_FIELDS = COMMON_FIELDS | {
    "method",
    "path",
    "status",
    "request_bytes",
    "response_bytes",
    "duration_ms",
}
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")

SUBJECT = Subject(
    client="127.0.0.1:40000",
    run_id="run_0123456789abcdef",
    policy="roastery-bot",
    policy_version=3,
    host="api.telegram.org",
    port=443,
    addr="149.154.167.220",
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


@pytest.fixture
def audit(path: Path) -> Iterator[AuditLog]:
    log = AuditLog(str(path))
    yield log
    log.close()


def lines(path: Path) -> list[dict[str, object]]:
    """JSON Lines: records end in '\\n' (and only there; str.splitlines would also split at U+2028)."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1]]


def test_connect_line_has_exactly_the_contract_fields(audit: AuditLog, path: Path) -> None:
    audit.record("connect", "allow", None, SUBJECT)
    (line,) = lines(path)
    assert set(line) == COMMON_FIELDS
    assert line == {
        "ts": line["ts"],
        "event": "connect",
        "decision": "allow",
        "reason": None,
        "run_id": "run_0123456789abcdef",
        "policy": "roastery-bot",
        "policy_version": 3,
        "client": "127.0.0.1:40000",
        "host": "api.telegram.org",
        "port": 443,
        "addr": "149.154.167.220",
    }
    assert isinstance(line["ts"], str)
    assert RFC3339_UTC.match(line["ts"])
    ts = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert abs((datetime.now(UTC) - ts).total_seconds()) < 60


def test_request_line_has_exactly_the_contract_fields(audit: AuditLog, path: Path) -> None:
    audit.record(
        "request",
        "deny",
        "path_not_allowed",
        SUBJECT,
        method="GET",
        path="/bot1/getUpdates",
        status=403,
        request_bytes=0,
        response_bytes=0,
        duration_ms=1.25,
    )
    (line,) = lines(path)
    assert set(line) == REQUEST_FIELDS
    assert (line["event"], line["decision"], line["reason"]) == ("request", "deny", "path_not_allowed")
    assert (line["method"], line["path"], line["status"]) == ("GET", "/bot1/getUpdates", 403)
    assert (line["request_bytes"], line["response_bytes"], line["duration_ms"]) == (0, 0, 1.25)


def test_unknown_subject_fields_are_null(audit: AuditLog, path: Path) -> None:
    audit.record("connect", "deny", "auth_required", Subject(client="[::1]:5000", host="example.com", port=443))
    (line,) = lines(path)
    assert set(line) == COMMON_FIELDS
    assert line["run_id"] is None
    assert line["policy"] is None
    assert line["policy_version"] is None
    assert line["addr"] is None
    assert line["client"] == "[::1]:5000"


def test_run_events(audit: AuditLog, path: Path) -> None:
    subject = Subject(run_id="run_1", policy="bot", policy_version=1)
    for what in ("mint", "revoke", "expire"):
        audit.record("run", "allow" if what == "mint" else "deny", None, subject, action=what)
    assert [line["event"] for line in lines(path)] == ["run", "run", "run"]


def test_one_line_per_record_even_with_newlines_in_values(audit: AuditLog, path: Path) -> None:
    audit.record("request", "deny", "bad_request", Subject(host="a\nb"), path="/x\r\ny")
    audit.record("connect", "deny", "invalid_host", Subject(host="bücher\u2028.example"))
    raw = path.read_bytes()
    assert raw.count(b"\n") == 2
    assert raw.endswith(b"\n")
    parsed = lines(path)
    assert parsed[0]["host"] == "a\nb"
    assert parsed[1]["host"] == "bücher\u2028.example"


def test_file_is_opened_append_only(audit: AuditLog, path: Path) -> None:
    flags = fcntl.fcntl(audit._fd, fcntl.F_GETFL)
    assert flags & os.O_APPEND
    assert flags & os.O_ACCMODE == os.O_WRONLY
    assert fcntl.fcntl(audit._fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_appends_after_existing_content_and_other_writers(path: Path) -> None:
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    first, second = AuditLog(str(path)), AuditLog(str(path))
    try:
        for i in range(20):
            (first if i % 2 else second).record("connect", "allow", None, Subject(port=i))
    finally:
        first.close()
        second.close()
    parsed = lines(path)
    assert parsed[0] == {"earlier": True}
    assert [line["port"] for line in parsed[1:]] == list(range(20))


def test_new_file_is_not_world_readable(audit: AuditLog, path: Path) -> None:
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0


def test_reopen_after_rename_writes_to_the_new_file(audit: AuditLog, path: Path) -> None:
    audit.record("connect", "allow", None, Subject(port=1))
    rotated = path.with_name("audit.jsonl.1")
    path.rename(rotated)
    audit.record("connect", "allow", None, Subject(port=2))  # still the old file until reopened
    audit.reopen()
    audit.record("connect", "allow", None, Subject(port=3))
    assert [line["port"] for line in lines(rotated)] == [1, 2]
    assert [line["port"] for line in lines(path)] == [3]


def test_reopen_without_rotation_keeps_appending(audit: AuditLog, path: Path) -> None:
    audit.record("connect", "allow", None, Subject(port=1))
    audit.reopen()
    audit.reopen()
    audit.record("connect", "allow", None, Subject(port=2))
    assert [line["port"] for line in lines(path)] == [1, 2]


def test_write_errors_are_counted_and_do_not_raise(caplog: pytest.LogCaptureFixture) -> None:
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("/dev/full is not available")
    log = AuditLog(str(full))
    try:
        log.record("connect", "deny", "token_invalid", SUBJECT)
        log.record("connect", "deny", "token_invalid", SUBJECT)
    finally:
        log.close()
    assert log.write_errors == 2
    assert "write failed" in caplog.text


def test_write_to_a_closed_log_is_counted(path: Path) -> None:
    log = AuditLog(str(path))
    log.close()
    log.record("connect", "allow", None, SUBJECT)
    assert log.write_errors == 1
    assert path.read_text(encoding="utf-8") == ""


def test_unwritable_path_fails_at_open(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        AuditLog(str(tmp_path / "missing-dir" / "audit.jsonl"))


def test_dash_means_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    log = AuditLog("-")
    log.record("connect", "allow", None, SUBJECT)
    log.close()  # must not close stdout
    log.record("connect", "allow", None, SUBJECT)
    out = capfd.readouterr().out.splitlines()
    assert len(out) == 2
    assert set(json.loads(out[0])) == COMMON_FIELDS
    assert log.write_errors == 0
