"""Steps 8-11 for every request inside a tunnel: SNI, Host/:authority, framing, method, path, upgrades.
Redirects need nothing here: they go back to the client untouched, and its next request comes through here."""

import time

from mitmproxy import http

from egressd.addons._flows import ALLOWED, CLIENT_PATH, INJECTED, refuse, request_fields, set_fields
from egressd.decision import RequestFacts, decide_request
from egressd.injection import inject
from egressd.reasons import ALLOW, Decision, Reason, deny
from egressd.service import Service
from egressd.tunnels import Tunnel


def request_facts(flow: http.HTTPFlow) -> RequestFacts:
    headers = flow.request.headers
    return RequestFacts(
        method=flow.request.method,
        path=flow.request.path,
        authority=flow.request.authority,
        host_headers=tuple(headers.get_all("host")),
        sni=flow.client_conn.sni,
        content_lengths=tuple(headers.get_all("content-length")),
        transfer_encoding="transfer-encoding" in headers,
        upgrade=", ".join(headers.get_all("upgrade")),
        http2_settings="http2-settings" in headers,
    )


class RequestGate:
    def __init__(self, service: Service) -> None:
        self.service = service

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        tunnel = self.service.tunnels.get(flow.client_conn.id)
        if tunnel is None or flow.response is not None:
            return
        if flow.error is not None:
            # mitmproxy refused the request itself (e.g. ambiguous framing) and answers it; audit that refusal.
            self.service.audit.record("request", "deny", Reason.BAD_REQUEST.value, tunnel.subject,
                                      **request_fields(flow, Reason.BAD_REQUEST.status))
            return
        decision = self._decide(tunnel, flow)
        if decision.allowed:
            decision = self._inject(tunnel, flow)
        if not decision.allowed:
            assert decision.reason is not None
            refuse(self.service.audit, flow, decision, tunnel.subject, "request",
                   **request_fields(flow, decision.reason.status))
            return
        flow.metadata[ALLOWED] = tunnel

    def _inject(self, tunnel: Tunnel, flow: http.HTTPFlow) -> Decision:
        """Swaps this run's placeholders for their values where they may go; refuses any that may not."""
        request = flow.request
        path, sep, query = request.path.partition("?")
        fields = [(name, value) for name, value in request.headers.items(multi=True)]
        injected = inject(tunnel.secrets, tunnel.target.host, fields, path, query)
        if isinstance(injected, Decision):
            return injected
        if injected.names:
            flow.metadata[CLIENT_PATH] = path
            set_fields(request.headers, injected.headers)
            request.path = injected.path + sep + injected.query
            flow.metadata[INJECTED] = injected.names
            self.service.record_injection(tunnel.run, injected.names)
        return ALLOW

    def _decide(self, tunnel: Tunnel, flow: http.HTTPFlow) -> Decision:
        if tunnel.upstream_tls_error is not None:
            return deny(Reason.UPSTREAM_ERROR,
                        f"TLS with {tunnel.target.host} failed: {tunnel.upstream_tls_error}")
        refused = tunnel.run.refusal(time.time())
        if refused is not None:
            return deny(refused, f"run {tunnel.run.run_id} is no longer active")
        policy = self.service.policy_of(tunnel.run)
        if isinstance(policy, Decision):
            return policy
        return decide_request(tunnel.target, request_facts(flow))
