"""Small helpers the addons share: a client's address text, a request's audit fields, and refusing a flow
(audit first, then reply)."""

import time

from mitmproxy import connection, ctx, http

from egressd.audit import AuditLog, Subject
from egressd.reasons import Decision
from egressd.refusal import REFUSED, refusal_response

# Flow metadata keys: the tunnel of a request the gate allowed (its audit line is written when it ends), and
# the names of the secrets injected into it.
ALLOWED = "egressd.allowed"
INJECTED = "egressd.injected"
CLIENT_PATH = "egressd.client_path"  # the path as the client sent it: with placeholders, never values


def client_text(client: connection.Client) -> str:
    host, port, *_ = client.peername
    return f"{host}:{port}"


def request_fields(flow: http.HTTPFlow, status: int | None, request_bytes: int = 0,
                   response_bytes: int = 0) -> dict[str, object]:
    """The audit fields of a request: never its query, a header value or a secret's value (only names)."""
    return {
        "method": flow.request.method,
        "path": flow.metadata.get(CLIENT_PATH) or flow.request.path.partition("?")[0],
        "status": status,
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
        "duration_ms": round((time.time() - flow.request.timestamp_start) * 1000, 3),
        "secrets": sorted(flow.metadata.get(INJECTED, ())),
    }


def set_fields(headers: http.Headers, pairs: list[tuple[str, str]]) -> None:
    """Replaces header (or trailer) fields with str pairs, encoded back exactly as mitmproxy decoded them."""
    headers.fields = tuple(
        (name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape")) for name, value in pairs
    )


def refuse(audit: AuditLog, flow: http.HTTPFlow, decision: Decision, subject: Subject, event: str,
           **extra: object) -> None:
    """Audits the refusal, then answers the flow with it: the line is written before the response goes out."""
    assert decision.reason is not None
    audit.record(event, "deny", decision.reason.value, subject, **extra)
    flow.response = refusal_response(decision, subject.host, subject.run_id)
    flow.metadata[REFUSED] = decision.reason.value


def cut_clients(client_ids: set[str], why: str) -> None:
    """Cuts client connections at once: the transport is aborted (buffered bytes are dropped, so nothing
    half-sent can look complete) and mitmproxy's handler for it is cancelled."""
    proxyserver = ctx.master.addons.get("proxyserver")
    for handler in list(proxyserver.connections.values()):
        if handler.client.id not in client_ids:
            continue
        io = handler.transports.get(handler.client)
        if io is None:
            continue
        transport = getattr(io.writer, "transport", None)
        if transport is not None:
            transport.abort()
        if io.handler is not None:
            io.handler.cancel(why)
