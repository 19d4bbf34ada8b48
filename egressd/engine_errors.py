"""Errors that mitmproxy detects and answers itself (smuggling-prone framing, a CONNECT inside a tunnel, an
upstream failing mid-request) come out in egressd's one refusal shape instead of mitmproxy's HTML page.

mitmproxy has no hook for these answers, so its HTTP/1 error-page builder is replaced (pinned to mitmproxy
12; `tests/integration` proves the shape end to end)."""

from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import _http1

from egressd.reasons import Decision, Reason
from egressd.refusal import refusal_response


def engine_reason(status_code: int) -> Reason:
    return Reason.UPSTREAM_ERROR if status_code >= 500 else Reason.BAD_REQUEST


def _error_response(status_code: int, message: str = "") -> bytes:
    reason = engine_reason(status_code)
    response = refusal_response(Decision(reason, message.split(". ")[0]), None, None)
    response.status_code = status_code
    response.reason = http.status_codes.RESPONSES.get(status_code, "Error")
    response.headers["Connection"] = "close"
    return http1.assemble_response(response)


def install() -> None:
    _http1.make_error_response = _error_response
