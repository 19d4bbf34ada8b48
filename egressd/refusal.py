"""The one shape every refusal has: JSON body, X-Egressd-Reason header, the reason's status."""

import json

from mitmproxy import http

from egressd.reasons import Decision

# Flow metadata key set on every flow egressd refused (its value: the reason code).
REFUSED = "egressd.refused"


def refusal_body(decision: Decision, host: str | None, run_id: str | None) -> dict[str, object]:
    assert decision.reason is not None
    return {
        "error": "egress_blocked",
        "reason": decision.reason.value,
        "detail": decision.detail,
        "host": host,
        "run_id": run_id,
    }


def refusal_response(decision: Decision, host: str | None, run_id: str | None) -> http.Response:
    assert decision.reason is not None
    headers = {"Content-Type": "application/json", "X-Egressd-Reason": decision.reason.value}
    if decision.reason.status == 407:
        headers["Proxy-Authenticate"] = 'Basic realm="egressd"'
    body = json.dumps(refusal_body(decision, host, run_id)).encode() + b"\n"
    return http.Response.make(decision.reason.status, body, headers)

