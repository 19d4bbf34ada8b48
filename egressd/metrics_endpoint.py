"""The observability endpoint: GET /metrics (Prometheus text format), /healthz, /readyz.

It is served on egressd's own event loop, so /healthz answering at all means the loop is responsive; and a
scrape only renders the series egressd keeps (O(number of series)), it never walks flows."""

import asyncio
import json
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from egressd.metrics import Metrics

log = logging.getLogger(__name__)

MAX_HEAD = 8192
TIMEOUT = 5.0


def not_ready(ca_loaded: bool, policies_loaded: bool, listeners_accepting: bool) -> list[str]:
    """What /readyz names as missing; empty when egressd can serve."""
    checks = (("ca", ca_loaded), ("policies", policies_loaded), ("listeners", listeners_accepting))
    return [name for name, ok in checks if not ok]


class MetricsEndpoint:
    def __init__(self, metrics: Metrics, host: str, port: int, missing: Callable[[], list[str]]) -> None:
        """`missing` names what is not ready yet (empty when ready): 'ca', 'policies', 'listeners'."""
        self.metrics = metrics
        self.host, self.port = host, port
        self.missing = missing
        self._server: asyncio.Server | None = None
        metrics.track(metrics.ready, lambda: 0.0 if self.missing() else 1.0)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEAD)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, content_type, body = self._answer(method, path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode() + (b"" if method == "HEAD" else body)
            )
            await asyncio.wait_for(writer.drain(), TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            missing = self.missing()
            body = json.dumps({"ready": not missing, "missing": missing}).encode() + b"\n"
            return ("503 Service Unavailable" if missing else "200 OK"), "application/json", body
        return "404 Not Found", "text/plain", b"not found\n"
