"""Small helpers the addons share: a client's address text, and refusing a flow (audit first, then reply)."""

from mitmproxy import connection, http

from egressd.audit import AuditLog, Subject
from egressd.reasons import Decision
from egressd.refusal import REFUSED, refusal_response


def client_text(client: connection.Client) -> str:
    host, port, *_ = client.peername
    return f"{host}:{port}"


def refuse(audit: AuditLog, flow: http.HTTPFlow, decision: Decision, subject: Subject, event: str,
           **extra: object) -> None:
    """Audits the refusal, then answers the flow with it: the line is written before the response goes out."""
    assert decision.reason is not None
    audit.record(event, "deny", decision.reason.value, subject, **extra)
    flow.response = refusal_response(decision, subject.host, subject.run_id)
    flow.metadata[REFUSED] = decision.reason.value
