"""Two narrow adaptations of mitmproxy 12's HTTP engine where it has no hook (pinned to mitmproxy 12;
`tests/integration` proves both end to end):

- Errors that mitmproxy detects and answers itself (smuggling-prone framing, a CONNECT inside a tunnel, an
  upstream failing mid-request) come out in egressd's one refusal shape instead of mitmproxy's HTML page.
- The body of a refused request is discarded as it arrives instead of buffered until its end, so a run
  cannot grow egressd's memory by sending a huge body that nothing will ever forward.
"""

from collections.abc import Generator

from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import HttpStream, RequestData, _http1

from egressd.reasons import Decision, Reason
from egressd.refusal import REFUSED, refusal_response

_consume_request_body = HttpStream.state_consume_request_body


def engine_reason(status_code: int) -> Reason:
    return Reason.UPSTREAM_ERROR if status_code >= 500 else Reason.BAD_REQUEST


def _error_response(status_code: int, message: str = "") -> bytes:
    reason = engine_reason(status_code)
    response = refusal_response(Decision(reason, message.split(". ")[0]), None, None)
    response.status_code = status_code
    response.reason = http.status_codes.RESPONSES.get(status_code, "Error")
    response.headers["Connection"] = "close"
    return http1.assemble_response(response)


def _discard_refused_request_body(self: HttpStream, event: object) -> Generator[object, object, None]:
    if isinstance(event, RequestData) and REFUSED in self.flow.metadata:
        return
    yield from _consume_request_body(self, event)


def install() -> None:
    _http1.make_error_response = _error_response
    HttpStream.state_consume_request_body = _discard_refused_request_body  # type: ignore[method-assign]
