"""`egressd run`: real bubblewrap sandboxes whose only way out is egressd.

A daemon of this module's own (port 3131); the sandboxed commands are curl, Python and sh from the host's
/usr, run as nobody in new namespaces with nothing but lo."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dns_server import ScriptedDNS
from tests.support.egressd_process import Egressd, basic
from tests.support.upstream import HttpsUpstream

CANARY = "CANARY-sandbox-secret-5e2a9d"
POLICY = """
name = "sandboxed"
version = 1

[[allow]]
host = "api.example.test"
reason = "the API the sandboxed tool calls"

[[secret]]
name = "API_KEY"
hosts = ["api.example.test"]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, dns: ScriptedDNS, test_ca_pem: Path,
           upstream: HttpsUpstream) -> Iterator[Egressd]:
    egressd = Egressd(tmp_path_factory.mktemp("launcher"), dns.server_spec, test_ca_pem, listen="127.0.0.1:3131",
                      metrics="127.0.0.1:9467")
    egressd.write_policy("sandboxed-v1.toml", POLICY)
    egressd.start()
    yield egressd
    egressd.stop()


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "api-key"
    path.write_text(CANARY)
    return path


def egressd_run(daemon: Egressd, secret_file: Path, *command: str, options: tuple[str, ...] = (),
                timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`egressd run --json …`: the command's own output, and the summary (the last line of stdout)."""
    done = subprocess.run(
        [sys.executable, "-m", "egressd", "run", "--config", str(daemon.config), "--policy", "sandboxed",
         "--secret", f"API_KEY=@{secret_file}", "--json", *options, "--", *command],
        capture_output=True, text=True, timeout=timeout,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, (done.returncode, done.stderr)
    return done, json.loads(lines[-1])


SUMMARY_KEYS = {"run_id", "exit_status", "limit", "wall_seconds", "mechanisms", "egress"}


def test_clients_inside_reach_allowed_hosts_only(daemon: Egressd, secret_file: Path, upstream: HttpsUpstream) -> None:
    script = (
        'echo "proxy=$HTTPS_PROXY"; '
        "curl -sS https://api.example.test/from-curl; echo; "
        "curl -sS -o /dev/null -w '%{http_connect}' https://other.example.test/ ; echo; "
        "python3 -c \"import urllib.request as u; print(u.urlopen('https://api.example.test/from-python').read()"
        ".decode())\""
    )
    done, summary = egressd_run(daemon, secret_file, "/bin/sh", "-c", script)
    assert done.returncode == 0, done.stderr
    assert set(summary) == SUMMARY_KEYS and summary["exit_status"] == 0 and summary["limit"] is None
    assert '"path": "/from-curl"' in done.stdout and '"path": "/from-python"' in done.stdout
    assert "403" in done.stdout.splitlines()
    assert summary["egress"]["allowed"] == 2 and summary["egress"]["refused"] == 1
    assert summary["egress"]["refusals"] == [{"host": "other.example.test", "reason": "host_not_allowed", "count": 1}]
    assert summary["mechanisms"] == {"memory": "cgroup-v1", "pids": "cgroup-v1", "seccomp": True}
    assert_token_revoked(daemon, done.stdout)


def test_placeholders_not_values_inside(daemon: Egressd, secret_file: Path, upstream: HttpsUpstream) -> None:
    script = (
        'curl -sS -H "Authorization: Bearer $API_KEY" https://api.example.test/with-key; echo; '
        "cat /proc/self/environ | tr '\\0' '\\n'; "
        "grep -rIl " + CANARY + " /etc /tmp . 2>/dev/null; "
        "grep -rIl 'PRIVATE KEY' /tmp /run . 2>/dev/null; "
        "ls /run/egressd; echo done"
    )
    done, summary = egressd_run(daemon, secret_file, "/bin/sh", "-c", script)
    assert summary["exit_status"] == 0, done.stderr
    output = done.stdout
    assert CANARY not in output  # not in the environment, no file holds it, and the reply was scrubbed
    assert "API_KEY=egressd_ph_" in output
    assert "PRIVATE KEY" not in output.split("ca.pem")[0]
    assert sorted(output.split("done")[0].split()[-3:]) == ["ca.pem", "forwarder.py", "proxy.sock"]
    seen = next(r for r in reversed(upstream.requests) if r["path"] == "/with-key")
    assert dict(seen["headers"])["authorization"] == f"Bearer {CANARY}"


def test_nothing_else_is_reachable(daemon: Egressd, secret_file: Path, upstream: HttpsUpstream) -> None:
    probe = """
import errno, os, socket, sys
results = []
for host, port in [("127.0.0.1", 9467), ("127.0.0.1", 3131), ("127.0.0.10", 443), ("127.0.0.53", 53),
                   ("10.0.0.1", 443), ("8.8.8.8", 443)]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); results.append(f"{host}:{port} OPEN")
    except OSError as err:
        results.append(f"{host}:{port} closed")
    finally:
        s.close()
for family, kind in [(socket.AF_INET, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW),
                     (socket.AF_NETLINK, socket.SOCK_RAW)]:
    try:
        socket.socket(family, kind, 1 if family == socket.AF_INET else 0).close(); results.append("raw OPEN")
    except OSError:
        results.append("raw refused")
print(sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
print("\\n".join(results))
"""
    paths = [str(daemon.root / "var" / "control.sock"), str(daemon.root / "ca" / "mitmproxy-ca.pem"),
             str(daemon.root / "var")]
    script = f"python3 -c '{probe}'; for p in {' '.join(paths)}; do test -e $p && echo VISIBLE $p; done; true"
    done, summary = egressd_run(daemon, secret_file, "/bin/sh", "-c", script)
    assert summary["exit_status"] == 0, done.stderr
    assert "OPEN" not in done.stdout and "VISIBLE" not in done.stdout
    assert "['lo']" in done.stdout
    assert done.stdout.count("closed") == 6 and done.stdout.count("raw refused") == 3


def test_timeout(daemon: Egressd, secret_file: Path) -> None:
    done, summary = egressd_run(daemon, secret_file, "/bin/sleep", "60", options=("--timeout", "2"))
    assert done.returncode == 124 and summary["exit_status"] == 124 and summary["limit"] == "timeout"
    assert 1.5 < summary["wall_seconds"] < 30
    assert_sandbox_gone("sleep 60")
    leftovers = [path for hierarchy in ("memory", "pids", "unified")
                 for path in Path(f"/sys/fs/cgroup/{hierarchy}").rglob(f"egressd-{summary['run_id'][4:]}")]
    assert leftovers == []  # the run's child cgroups are removed


def test_memory_limit(daemon: Egressd, secret_file: Path) -> None:
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))"
    done, summary = egressd_run(daemon, secret_file, "/usr/bin/python3", "-c", hog, options=("--memory", "64M"))
    assert done.returncode == 137 and summary["limit"] == "memory"


def test_pids_limit(daemon: Egressd, secret_file: Path) -> None:
    bomb = ("import os, time\nchildren = 0\ntry:\n    while children < 10000:\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n            os._exit(0)\n        children += 1\nexcept OSError:\n"
            "    print('fork refused after', children)\n")
    done, summary = egressd_run(daemon, secret_file, "/usr/bin/python3", "-c", bomb, options=("--pids", "16"))
    assert summary["limit"] == "pids", done.stdout
    assert "fork refused after" in done.stdout
    assert_sandbox_gone("time.sleep(30)")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_run_ends_when_the_launcher_is_stopped(daemon: Egressd, secret_file: Path, signum: int) -> None:
    marker = f"sleep {300 + signum}"
    script = f'echo "proxy=$HTTPS_PROXY"; {marker}'
    launcher = subprocess.Popen(
        [sys.executable, "-m", "egressd", "run", "--config", str(daemon.config), "--policy", "sandboxed",
         "--secret", f"API_KEY=@{secret_file}", "--json", "--", "/bin/sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while not sandbox_processes(marker):
        assert time.monotonic() < deadline, "the sandbox did not start"
        time.sleep(0.1)
    launcher.send_signal(signum)
    stdout, _ = launcher.communicate(timeout=30)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["exit_status"] == 128 + signum
    assert_sandbox_gone(marker)
    assert_token_revoked(daemon, stdout)


def test_command_line_secret_values_are_refused(daemon: Egressd) -> None:
    done = subprocess.run([sys.executable, "-m", "egressd", "run", "--config", str(daemon.config), "--policy",
                           "sandboxed", "--secret", f"API_KEY={CANARY}", "--", "true"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "visible to every local user" in done.stderr and CANARY not in done.stderr


def test_protected_paths_cannot_be_bound(daemon: Egressd, secret_file: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "egressd", "run", "--config", str(daemon.config), "--policy",
                           "sandboxed", "--secret", f"API_KEY=@{secret_file}", "--ro", str(daemon.root), "--",
                           "true"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "would expose" in done.stderr


def assert_token_revoked(daemon: Egressd, output: str) -> None:
    """The token the sandbox held (it printed its proxy URL) no longer opens a tunnel."""
    proxy = next(line for line in output.splitlines() if line.startswith("proxy="))
    token = proxy.split("egressd:", 1)[1].split("@", 1)[0]
    sock, status, headers, _ = daemon.connect("api.example.test:443", basic(token))
    sock.close()
    assert (status, headers["x-egressd-reason"]) == (407, "token_revoked")


def sandbox_processes(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and "pytest" not in cmdline and "egressd run" not in cmdline:
                found.append(int(entry))
    return found


def assert_sandbox_gone(marker: str) -> None:
    deadline = time.monotonic() + 5
    while sandbox_processes(marker):
        assert time.monotonic() < deadline, f"sandbox processes survived: {sandbox_processes(marker)}"
        time.sleep(0.1)
