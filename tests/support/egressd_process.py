"""The real `egressd serve` process for integration tests, and real clients (curl, raw sockets) through it."""

import base64
import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 20.0


@dataclass
class CurlResult:
    status: int  # the final status curl saw (the CONNECT's when the tunnel was refused)
    headers: dict[str, str]
    body: str
    exit_code: int
    stderr: str

    def json(self) -> dict:
        return json.loads(self.body)


def curl_path() -> str:
    path = shutil.which("curl")
    if path is None:
        raise RuntimeError("curl is required for the integration tests (apt-get install curl)")
    return path


class Egressd:
    """One daemon in its own directory: config, policies, CA, state and audit log all under `root`."""

    def __init__(self, root: Path, dns_spec: str, upstream_ca: Path, listen: str = "127.0.0.1:3128",
                 metrics: str = "127.0.0.1:9464", extra_config: str = "") -> None:
        self.root = root
        self.listen = listen
        self.metrics_listen = metrics
        self.policies = root / "policies"
        self.policies.mkdir(parents=True, exist_ok=True)
        self.config = root / "egressd.toml"
        self.config.write_text(
            f"""
[proxy]
listen = ["{listen}"]
[metrics]
listen = "{metrics}"
[paths]
policies = "policies"
ca = "ca"
state = "var"
audit_log = "var/audit.jsonl"
[dns]
servers = ["{dns_spec}"]
timeout = 0.5
min_ttl = 0
max_ttl = 30
[upstream]
ca_file = "{upstream_ca}"
connect_timeout = 3.0
allow_cidrs = ["127.0.0.8/29"]
{extra_config}
"""
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.log_file = root / "egressd.log"

    # --- lifecycle ------------------------------------------------------------------------------------

    def write_policy(self, filename: str, text: str) -> None:
        (self.policies / filename).write_text(text)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "egressd", "serve", "--config", str(self.config)]

    def start(self) -> "Egressd":
        socket_path = self.root / "var" / "control.sock"
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + START_TIMEOUT
        host, port = self.listen.rsplit(":", 1)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"egressd exited at start ({self.process.returncode}):\n{self.log()}")
            if socket_path.exists() and _accepts(host, int(port)):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"egressd did not start within {START_TIMEOUT}s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process)
        self.process = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    # --- CLI ------------------------------------------------------------------------------------------

    def cli(self, *words: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """`egressd WORDS… --config CFG` (the flag after the subcommand's own words, as the contract says)."""
        return subprocess.run(
            [sys.executable, "-m", "egressd", *words, "--config", str(self.config)],
            capture_output=True, text=True, timeout=30, input=input_text, cwd=self.root,
        )

    def mint(self, policy: str, *extra: str) -> dict:
        done = self.cli("token", "mint", "--policy", policy, *extra)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca" / "mitmproxy-ca-cert.pem"

    @property
    def proxy_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    # --- observability ------------------------------------------------------------------------------------

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET on the metrics endpoint: (status, body)."""
        host, port = self.metrics_listen.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            status, _, body = read_response(sock, timeout)
        return status, body.decode()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        status, text = self.http_get("/metrics")
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    # --- audit ----------------------------------------------------------------------------------------

    @property
    def audit_path(self) -> Path:
        return self.root / "var" / "audit.jsonl"

    def audit(self) -> list[dict]:
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line]

    def wait_audit(self, match: Callable[[dict], bool], timeout: float = 3.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.audit() if match(line)]
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"no audit line matched within {timeout}s; last lines: {self.audit()[-5:]}")
            time.sleep(0.05)

    # --- clients ------------------------------------------------------------------------------------------

    def curl(self, url: str, token: str | None, *args: str, timeout: float = 10.0) -> CurlResult:
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        if token is not None:
            proxy = f"http://egressd:{token}@127.0.0.1:{self.proxy_port}"
        command = [curl_path(), "-sS", "-D", "-", "--max-time", str(timeout), "--proxy", proxy,
                   "--cacert", str(self.ca_cert), "--noproxy", "", *args, url]
        done = subprocess.run(command, capture_output=True, timeout=timeout + 5)
        return _parse_curl(done)

    def connect(self, target: str, authorization: str | None,
                timeout: float = 5.0) -> tuple[socket.socket, int, dict[str, str], bytes]:
        """Sends a raw CONNECT; returns the socket and the proxy's answer (status, headers, body)."""
        sock = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=timeout)
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if authorization is not None:
            lines.append(f"Proxy-Authorization: {authorization}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            status, headers, body = read_response(sock, timeout)
        except Exception:
            sock.close()
            raise
        return sock, status, headers, body

    @contextlib.contextmanager
    def tunnel(self, host: str, token: str, timeout: float = 5.0) -> Iterator[socket.socket]:
        """An open CONNECT tunnel to host:443."""
        sock, status, _, body = self.connect(f"{host}:443", basic(token), timeout)
        try:
            assert status == 200, (status, body)
            yield sock
        finally:
            sock.close()

    def tls_in_tunnel(self, sock: socket.socket, server_hostname: str | None,
                      alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLSocket:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if server_hostname is None:
            context.check_hostname = False
        context.set_alpn_protocols(list(alpn))
        return context.wrap_socket(sock, server_hostname=server_hostname)


def basic(token: str, user: str = "egressd") -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def read_head(sock: socket.socket, limit: int = 65536) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            break
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def read_response(sock: socket.socket, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body (what egressd's refusals and the echo server send)."""
    sock.settimeout(timeout)
    head, body = read_head(sock)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body[:length]


def rss_kib(pid: int) -> int:
    """A process's resident memory, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _parse_curl(done: subprocess.CompletedProcess[bytes]) -> CurlResult:
    out = done.stdout.decode("utf-8", errors="replace")
    status, headers, body = 0, {}, out
    # -D - prints every response head (CONNECT's, then the request's); the last one is the answer.
    while out.startswith("HTTP/"):
        head, _, out = out.partition("\r\n\r\n")
        lines = head.split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = out
    return CurlResult(status, headers, body, done.returncode, done.stderr.decode(errors="replace"))
