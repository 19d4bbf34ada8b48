"""Steps 1-7 at the CONNECT: who the run is, whether its policy lets it reach the target, and where exactly
the tunnel will lead. Also refuses anything that is not a CONNECT (plain-HTTP proxying)."""

from dataclasses import replace

from mitmproxy import connection, http

from egressd.addons._flows import client_text, refuse
from egressd.audit import Subject
from egressd.reasons import Decision, Reason, deny
from egressd.refusal import REFUSED
from egressd.runs import Run
from egressd.service import Service
from egressd.tunnels import Tunnel


class ConnectGate:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        client = client_text(flow.client_conn)
        raw_host, port = flow.request.host, flow.request.port
        subject = Subject(client=client, host=raw_host, port=port)
        run = self._authenticate(flow, subject)
        if run is None:
            return
        subject = replace(subject, run_id=run.run_id, policy=run.policy, policy_version=run.version)
        policy = self.service.policy_of(run)
        if isinstance(policy, Decision):
            refuse(self.service.audit, flow, policy, subject, "connect")
            return
        checked = await self.service.check_target(policy, raw_host, port)
        if checked.target is not None:
            subject = replace(subject, host=checked.target.host, addr=checked.addr)
        if not checked.decision.allowed:
            refuse(self.service.audit, flow, checked.decision, subject, "connect")
            return
        assert checked.target is not None and checked.addr is not None
        self.service.audit.record("connect", "allow", None, subject)
        secrets = self.service.run_secrets(run, policy)
        self.service.tunnels.open(flow.client_conn.id, Tunnel(run, checked.target, checked.addr, subject, secrets))

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        """mitmproxy could not open the upstream TCP connection: answer in egressd's own words."""
        tunnel = self.service.tunnels.close(flow.client_conn.id)
        if tunnel is None or flow.metadata.get(REFUSED):
            return
        why = flow.server_conn.error or "connection failed"
        if tunnel.connect_timed_out:
            why = f"no answer within {self.service.config.upstream.connect_timeout:g} s"
        self.service.metrics.upstream_errors.labels("timeout" if tunnel.connect_timed_out else "connect").inc()
        refuse(self.service.audit, flow,
               deny(Reason.UPSTREAM_ERROR, f"cannot connect to {tunnel.target.host} ({tunnel.addr}): {why}"),
               tunnel.subject, "connect")

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """A request outside any tunnel is plain-HTTP proxying: authenticated first, then refused."""
        if self.service.tunnels.get(flow.client_conn.id) is not None:
            return
        subject = Subject(client=client_text(flow.client_conn), host=flow.request.pretty_host or None,
                          port=flow.request.port or None)
        run = self._authenticate(flow, subject)
        if run is None:
            return
        subject = replace(subject, run_id=run.run_id, policy=run.policy, policy_version=run.version)
        refuse(self.service.audit, flow, deny(Reason.HTTPS_ONLY, "only HTTPS through CONNECT is proxied"),
               subject, "connect")

    def client_disconnected(self, client: connection.Client) -> None:
        self.service.tunnels.close(client.id)

    def _authenticate(self, flow: http.HTTPFlow, subject: Subject) -> Run | None:
        headers = flow.request.headers
        header = headers.get("proxy-authorization")
        if len(headers.get_all("proxy-authorization")) > 1:
            header = "ambiguous"  # two credentials: refused as invalid rather than guessing
        found = self.service.authenticate(header)
        if isinstance(found, Decision):
            refuse(self.service.audit, flow, found, subject, "connect")
            return None
        return found
