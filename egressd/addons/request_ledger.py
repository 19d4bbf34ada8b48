"""Accounts for allowed requests: streams both bodies (memory per flow stays bounded) while counting their
bytes, and writes the request's audit line when it ends."""

import time
from collections.abc import Callable

from mitmproxy import http

from egressd.addons._flows import ALLOWED, request_fields
from egressd.refusal import REFUSED
from egressd.service import Service
from egressd.tunnels import Tunnel

_SENT = "egressd.request_bytes"
_RECEIVED = "egressd.response_bytes"


Stream = Callable[[bytes], bytes | list[bytes]]


def _counter(flow: http.HTTPFlow, key: str, inner: Stream | None = None) -> Stream:
    """The outermost stream function of a body: counts what passes, after `inner` (e.g. the scrubber)."""
    flow.metadata[key] = 0

    def count(chunk: bytes) -> bytes | list[bytes]:
        out = inner(chunk) if inner is not None else chunk
        assert isinstance(out, bytes)
        flow.metadata[key] += len(out)
        # Nothing to pass on yet: no write at all, since an empty write would end a chunked HTTP/1 body.
        return out if out else []

    return count


class RequestLedger:
    def __init__(self, service: Service) -> None:
        self.service = service

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if ALLOWED in flow.metadata:
            flow.request.stream = _counter(flow, _SENT)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        tunnel: Tunnel | None = flow.metadata.get(ALLOWED)
        if tunnel is not None and flow.response is not None:
            # Counts what goes back to the client: after the reply scrubber, when there is one.
            inner = flow.response.stream
            flow.response.stream = _counter(flow, _RECEIVED, inner if callable(inner) else None)
            waited = (flow.response.timestamp_start or time.time()) - flow.request.timestamp_start
            self.service.metrics.request_duration.labels(tunnel.run.policy).observe(max(waited, 0.0))

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            self._write(flow, flow.response.status_code)

    def error(self, flow: http.HTTPFlow) -> None:
        if ALLOWED in flow.metadata and flow.error is not None and "server" in flow.error.msg.lower():
            self.service.metrics.upstream_errors.labels("reset").inc()
        self._write(flow, None)

    def _write(self, flow: http.HTTPFlow, status: int | None) -> None:
        tunnel: Tunnel | None = flow.metadata.pop(ALLOWED, None)
        if tunnel is None:
            return
        sent, received = flow.metadata.get(_SENT, 0), flow.metadata.get(_RECEIVED, 0)
        self.service.metrics.upstream_bytes.labels("sent").inc(sent)
        self.service.metrics.upstream_bytes.labels("received").inc(received)
        fields = request_fields(flow, status, sent, received)
        if flow.error is not None:
            fields["error"] = flow.error.msg
        refused = flow.metadata.get(REFUSED)  # the reply was refused after the request went out
        self.service.audit.record("request", "deny" if refused else "allow", refused, tunnel.subject, **fields)
