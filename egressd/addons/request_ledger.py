"""Accounts for allowed requests: streams both bodies (memory per flow stays bounded) while counting their
bytes, and writes the request's audit line when it ends."""

from collections.abc import Callable

from mitmproxy import http

from egressd.addons._flows import ALLOWED, request_fields
from egressd.tunnels import Tunnel

_SENT = "egressd.request_bytes"
_RECEIVED = "egressd.response_bytes"


def _counter(flow: http.HTTPFlow, key: str) -> Callable[[bytes], bytes]:
    flow.metadata[key] = 0

    def count(chunk: bytes) -> bytes:
        flow.metadata[key] += len(chunk)
        return chunk

    return count


class RequestLedger:
    def __init__(self, audit_record: Callable[..., None]) -> None:
        self._record = audit_record

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if ALLOWED in flow.metadata:
            flow.request.stream = _counter(flow, _SENT)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if ALLOWED in flow.metadata and flow.response is not None:
            flow.response.stream = _counter(flow, _RECEIVED)

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            self._write(flow, flow.response.status_code)

    def error(self, flow: http.HTTPFlow) -> None:
        self._write(flow, None)

    def _write(self, flow: http.HTTPFlow, status: int | None) -> None:
        tunnel: Tunnel | None = flow.metadata.pop(ALLOWED, None)
        if tunnel is None:
            return
        fields = request_fields(flow, status, flow.metadata.get(_SENT, 0), flow.metadata.get(_RECEIVED, 0))
        if flow.error is not None:
            fields["error"] = flow.error.msg
        self._record("request", "allow", None, tunnel.subject, **fields)
