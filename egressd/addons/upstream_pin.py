"""Every upstream connection of a tunnel goes to the one address the gate checked, with the tunnel's host as
TLS server name (so the certificate is verified against it), within the configured connect timeout."""

import asyncio

from mitmproxy import connection
from mitmproxy.proxy import server_hooks
from mitmproxy.tls import TlsData

from egressd.decision import HTTPS_PORT
from egressd.service import Service
from egressd.tunnels import Tunnel


class UpstreamPin:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        tunnel = self.service.tunnels.get(data.client.id)
        if tunnel is None:
            # No checked tunnel behind this connection: nothing may be opened (fail closed).
            data.server.error = "egressd: no checked destination for this connection"
            return
        data.server.address = (tunnel.addr, HTTPS_PORT)
        data.server.sni = tunnel.target.host
        # mitmproxy has no connect timeout of its own; cancel the connecting task when it runs out.
        task = asyncio.current_task()
        if task is not None:
            timeout = self.service.config.upstream.connect_timeout
            tunnel.connect_timer = asyncio.get_running_loop().call_later(timeout, self._time_out, tunnel, task)

    def _time_out(self, tunnel: Tunnel, task: asyncio.Task[object]) -> None:
        tunnel.connect_timed_out = True
        task.cancel()

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._stop_timer(data.client)

    def server_connect_error(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._stop_timer(data.client)

    def tls_failed_server(self, data: TlsData) -> None:
        """Remembered so the tunnel's next request gets a clear upstream_error instead of a retry."""
        self.service.metrics.upstream_errors.labels("tls").inc()
        tunnel = self.service.tunnels.get(data.context.client.id)
        if tunnel is not None:
            tunnel.upstream_tls_error = data.conn.error or "TLS handshake failed"

    def _stop_timer(self, client: connection.Client) -> None:
        tunnel = self.service.tunnels.get(client.id)
        if tunnel is not None and tunnel.connect_timer is not None:
            tunnel.connect_timer.cancel()
            tunnel.connect_timer = None
