"""No injected value reaches a run through a reply: every value injected on the run is replaced by its
placeholder in the reply's headers and body (raw, base64 and percent-encoded, also compressed and split
across chunks), streaming with bounded memory. A reply that cannot be scrubbed is refused, never passed."""

import logging
from collections.abc import Callable

from mitmproxy import http

from egressd.addons._flows import ALLOWED, cut_clients, set_fields
from egressd.reasons import Reason, deny
from egressd.refusal import REFUSED, refusal_response
from egressd.scrub import BodyScrubber, Scrubber, ScrubError, Secret, body_scrubber
from egressd.service import Service
from egressd.tunnels import Tunnel

log = logging.getLogger(__name__)

SCRUBBED = "egressd.scrubbed"  # flow metadata: names of the secrets found (and replaced) in the reply


class ReplyScrubber:
    def __init__(self, service: Service) -> None:
        self.service = service

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        tunnel: Tunnel | None = flow.metadata.get(ALLOWED)
        response = flow.response
        if tunnel is None or response is None:
            return
        names = frozenset(self.service.injected_names(tunnel.run.run_id))  # with this request's
        if not names:
            return
        scrubber = _scrubber(tunnel, names)
        found: set[str] = set()
        _scrub_fields(scrubber, response.headers, found)
        flow.metadata[SCRUBBED] = found
        if _has_no_body(flow):
            return
        try:
            body = body_scrubber(scrubber, response.headers.get("content-encoding"))
        except ScrubError as err:
            self._refuse(flow, tunnel, str(err))
            return
        # The body goes back decoded and changes length: drop the encoding and the length, frame it anew.
        response.headers.pop("content-encoding", None)
        response.headers.pop("content-length", None)
        if flow.request.http_version == "HTTP/1.1":
            response.headers["transfer-encoding"] = "chunked"
        elif flow.request.http_version in ("HTTP/1.0", "HTTP/0.9"):
            response.headers["connection"] = "close"
        response.stream = self._stream(flow, body, found)

    def response(self, flow: http.HTTPFlow) -> None:
        tunnel: Tunnel | None = flow.metadata.get(ALLOWED)
        if tunnel is None or SCRUBBED not in flow.metadata:
            return
        found: set[str] = flow.metadata[SCRUBBED]
        if flow.response is not None and flow.response.trailers and tunnel.scrubber is not None:
            _scrub_fields(tunnel.scrubber[1], flow.response.trailers, found)  # trailers go after this hook
        for name in found:
            self.service.metrics.scrubbed_replies.labels(tunnel.run.policy, name).inc()

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """Messages from the upstream of an allowed WebSocket are scrubbed like any reply."""
        tunnel = self.service.tunnels.get(flow.client_conn.id)
        if tunnel is None or flow.websocket is None:
            return
        message = flow.websocket.messages[-1]
        names = frozenset(self.service.injected_names(tunnel.run.run_id))
        if message.from_client or not names:
            return
        scrubbed, found = _scrubber(tunnel, names).scrub(message.content)
        message.content = scrubbed
        for name in found:
            self.service.metrics.scrubbed_replies.labels(tunnel.run.policy, name).inc()

    def _stream(self, flow: http.HTTPFlow, body: BodyScrubber, found: set[str]) -> Callable[[bytes], bytes]:
        failed = False

        def scrub(chunk: bytes) -> bytes:
            nonlocal failed
            if failed:
                return b""
            try:
                out = body.feed(chunk) if chunk else body.finish()
            except ScrubError as err:
                # Headers are out already: the reply is cut off, so the client sees it broken, never whole.
                failed = True
                flow.metadata[REFUSED] = Reason.SCRUB_FAILED.value
                log.warning("reply from %s cut mid-stream: cannot scrub it: %s", flow.request.pretty_host, err)
                cut_clients({flow.client_conn.id}, "egressd: reply cannot be scrubbed")
                return b""
            found.update(body.found)
            return out

        return scrub

    def _refuse(self, flow: http.HTTPFlow, tunnel: Tunnel, why: str) -> None:
        decision = deny(Reason.SCRUB_FAILED, f"the reply from {tunnel.target.host} cannot be scrubbed: {why}")
        refusal = refusal_response(decision, tunnel.target.host, tunnel.run.run_id)
        content = refusal.content or b""
        sent = False

        def once(chunk: bytes) -> bytes:
            """Our refusal's body in place of the upstream's, which is read and dropped."""
            nonlocal sent
            if sent:
                return b""
            sent = True
            return content

        refusal.stream = once
        flow.response = refusal
        flow.metadata[REFUSED] = Reason.SCRUB_FAILED.value


def _scrubber(tunnel: Tunnel, names: frozenset[str]) -> Scrubber:
    """The tunnel's scrubber for these secrets, built once (it precomputes every form of every value)."""
    if tunnel.scrubber is None or tunnel.scrubber[0] != names:
        placeholder_of = {name: placeholder for placeholder, name in tunnel.secrets.names.items()}
        tunnel.scrubber = names, Scrubber([
            Secret(name, tunnel.secrets.values[name].encode(), placeholder_of[name].encode())
            for name in sorted(names) if name in tunnel.secrets.values
        ])
    return tunnel.scrubber[1]


def _scrub_fields(scrubber: Scrubber, headers: http.Headers, found: set[str]) -> None:
    """Scrubs every header (or trailer) value in place; names are left as they are."""
    pairs = []
    for name, value in headers.items(multi=True):
        scrubbed, hits = scrubber.scrub_text(value)
        found |= hits
        pairs.append((name, scrubbed))
    set_fields(headers, pairs)


def _has_no_body(flow: http.HTTPFlow) -> bool:
    assert flow.response is not None
    status = flow.response.status_code
    return (flow.request.method == "HEAD" or status < 200 or status in (204, 304)  # 101: a WebSocket follows
            or flow.response.headers.get("content-length") == "0")
