"""Real HTTPS upstream servers for tests: HTTP/1.1 and HTTP/2 over TLS, certificates from a trustme CA.

Usage::

    ca = make_test_ca()
    write_ca_pem(ca, tmp_path / "ca.pem")
    with HttpsUpstream(ca=ca, hostnames=("api.example.test",), name="up1") as up:   # 127.0.0.10:443
        ...  # drive a client at https://api.example.test/ resolved to 127.0.0.10
        (req,) = up.requests
        assert req["http_version"] == "2" and req["sni"] == "api.example.test"

A server whose certificate is for the wrong name is ``HttpsUpstream(hostnames=("other.test",))``;
a listener that accepts TCP and closes at once (TLS fails) is :class:`TcpOnly`.

Routes (any method; HEAD gets the headers without the body):

* default, any path: 200 ``application/json`` echoing ``{"server", "method", "path" (raw, with
  query), "query" (raw, without "?"), "headers" ({lowercased name: value}, repeats joined with
  ", "; on HTTP/2 without pseudo-headers), "authority" (Host or :authority), "body_len",
  "http_version" ("1.0", "1.1" or "2"), "sni" (null when the client sent none)}``.
* ``/status/N`` (200..599): status N, small text body (none for 204 and 304).
* ``/redirect?to=URL[&status=30x]``: 302 (or the given 3xx) with ``Location: URL``.
* ``/bytes/N``: N bytes (at most 64 MiB) of :func:`expected_bytes` content, streamed in 64 KiB
  pieces (chunked on HTTP/1.1, close-delimited on HTTP/1.0, DATA frames under flow control on h2).
* ``/slow/N``: waits N seconds (float, at most 60) then answers like the default route.
* ``/response-headers?Name=Value&...``: the echo, with those headers added to the response.
* ``/reflect?[encoding=gzip|deflate|br|zstd][&size=N][&split=K][&corrupt=1]``: every header value, the path
  and the query given back raw, base64- and percent-encoded, also as ``X-Reflect-*`` response headers;
  compressed, repeated to N bytes, sent in separate K-byte pieces, its second half garbled, on request.

Every response carries ``X-Upstream: <name>``.  Every complete request is recorded in
:attr:`HttpsUpstream.requests` before it is answered.  HTTP/1.1 keep-alive, ``Expect:
100-continue``, chunked request bodies and h2 prior knowledge without ALPN are supported.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import os
import ssl
import threading
import time
import weakref
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, quote

import brotli

try:
    from compression import zstd  # Python 3.14
except ImportError:
    from backports import zstd  # mitmproxy brings it

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import trustme

from tests.support.loop_thread import LoopThread

__all__ = [
    "MAX_BODY",
    "MAX_SLOW",
    "HttpsUpstream",
    "TcpOnly",
    "expected_bytes",
    "make_test_ca",
    "write_ca_pem",
]

MAX_BODY = 64 * 1024 * 1024  # largest /bytes/N answer and largest request body accepted
MAX_SLOW = 60.0  # longest /slow/N wait, seconds
_CHUNK = 64 * 1024
_IDLE_TIMEOUT = 30.0
_HANDSHAKE_TIMEOUT = 5.0
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_PATTERN = bytes(range(256)) * (_CHUNK // 256)


def make_test_ca() -> trustme.CA:
    """A fresh throwaway certificate authority."""
    return trustme.CA()


def write_ca_pem(ca: trustme.CA, path: str | os.PathLike[str]) -> Path:
    """Write the CA certificate (PEM) to ``path`` and return it as a Path."""
    out = Path(path)
    out.write_bytes(ca.cert_pem.bytes())
    return out


def expected_bytes(n: int, offset: int = 0) -> bytes:
    """The body ``/bytes/N`` sends: byte i is ``i % 256``."""
    start = offset % 256
    reps = (start + n) // len(_PATTERN) + 1
    return (_PATTERN * reps)[start : start + n]


@dataclass
class _Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    stream_len: int | None = None  # set for /bytes/N: body is generated, ``body`` unused
    pieces: list[bytes] | None = None  # set for /reflect: sent as these separate writes (chunks)

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.pieces is not None:
            for piece in self.pieces:
                yield piece
            return
        if self.stream_len is None:
            if self.body:
                yield self.body
            return
        sent = 0
        while sent < self.stream_len:
            piece = expected_bytes(min(_CHUNK, self.stream_len - sent), sent)
            sent += len(piece)
            yield piece


class _BadRequest(Exception):
    pass


class _Bound:
    """A server listening on ``ip``:``port`` (the port known once it is started)."""

    ip: str
    _port: int | None
    _server: asyncio.Server | None
    _lt: LoopThread
    _shutdown: Callable[[], Awaitable[None]]  # each server's own

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.ip, self.port)

    def _bind(self, bind: Callable[[], Awaitable[asyncio.Server]]) -> None:
        """Binds on the server's loop thread; a failure stops that thread again."""
        try:
            self._server = self._lt.run(bind())
        except BaseException:
            self._lt.stop(self._shutdown)
            raise
        self._port = self._server.sockets[0].getsockname()[1]


class HttpsUpstream(_Bound):
    """An HTTPS server on ``ip``:``port`` with a leaf certificate from ``ca`` for ``hostnames``."""

    def __init__(
        self,
        ip: str = "127.0.0.10",
        port: int = 443,
        ca: trustme.CA | None = None,
        hostnames: Sequence[str] = ("api.example.test",),
        name: str = "up1",
        *,
        alpn: Sequence[str] = ("h2", "http/1.1"),
    ) -> None:
        self.ip = ip
        self._requested_port = port
        self._port: int | None = None
        self.ca = ca if ca is not None else make_test_ca()
        self.hostnames = tuple(hostnames)
        self.name = name
        self.alpn = tuple(alpn)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._requests: list[dict[str, Any]] = []
        self._connections = 0
        self._sni: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._lt = LoopThread(f"HttpsUpstream-{name}")
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    # ----------------------------------------------------------------------------------- lifecycle
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ca.issue_cert(*self.hostnames).configure_cert(ctx)
        if self.alpn:
            ctx.set_alpn_protocols(list(self.alpn))

        def on_sni(ssl_obj: Any, server_name: str | None, _ctx: ssl.SSLContext) -> None:
            if server_name is not None:
                self._sni[ssl_obj] = server_name

        ctx.sni_callback = on_sni
        return ctx

    def start(self) -> Self:
        if self._lt.loop is not None:
            raise RuntimeError("HttpsUpstream already started")
        ctx = self._ssl_context()
        self._lt.start()

        async def bind() -> asyncio.Server:
            return await asyncio.start_server(
                self._handle,
                host=self.ip,
                port=self._requested_port,
                ssl=ctx,
                ssl_handshake_timeout=_HANDSHAKE_TIMEOUT,
                reuse_address=True,
                backlog=128,
            )

        self._bind(bind)
        return self

    def stop(self) -> None:
        self._lt.stop(self._shutdown)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # no TLS close_notify dance: the loop is about to stop
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0)  # let the aborted transports run connection_lost and close their sockets

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------ inspection
    def url(self, path: str = "/", host: str | None = None) -> str:
        """``https://<host or first hostname>[:port]<path>``."""
        host = host or self.hostnames[0]
        port = "" if self.port == 443 else f":{self.port}"
        return f"https://{host}{port}{path}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Copies of the recorded requests: method, path, headers (list of pairs), body, http_version,
        sni, authority, scheme, client (peer address), server (name), time."""
        with self._lock:
            return [dict(r) for r in self._requests]

    @property
    def connection_count(self) -> int:
        """TCP+TLS connections that completed the handshake."""
        with self._lock:
            return self._connections

    @property
    def errors(self) -> list[str]:
        """TLS handshake failures and other errors the server shrugged off."""
        return list(self._lt.errors)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
            self._connections = 0
        self._lt.errors.clear()

    def wait_for_requests(self, n: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least ``n`` requests are recorded; raises TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._requests) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.name}: {len(self._requests)} requests, wanted {n}")
                self._cond.wait(remaining)
            return [dict(r) for r in self._requests]

    def _record(self, req: dict[str, Any]) -> None:
        with self._cond:
            self._requests.append(req)
            self._cond.notify_all()

    # ------------------------------------------------------------------------------------ connection
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            with self._lock:
                self._connections += 1
            ssl_obj = writer.get_extra_info("ssl_object")
            info = {
                "sni": self._sni.get(ssl_obj) if ssl_obj is not None else None,
                "client": writer.get_extra_info("peername"),
            }
            alpn = ssl_obj.selected_alpn_protocol() if ssl_obj is not None else None
            if alpn == "h2":
                await self._serve_h2(reader, writer, info, b"")
            else:
                await self._serve_h1(reader, writer, info)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bad client must never take the server down
            self._lt.errors.append(f"handler: {exc!r}")
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    # ------------------------------------------------------------------------------------- HTTP/1.x
    async def _serve_h1(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, info: dict[str, Any]
    ) -> None:
        first = True
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _IDLE_TIMEOUT)
            except asyncio.LimitOverrunError:
                await self._h1_simple(writer, 431, "header block too large")
                return
            except asyncio.IncompleteReadError:
                return
            if first and head == _H2_PREFACE[:18]:
                await self._serve_h2(reader, writer, info, head)
                return
            first = False
            try:
                req, keep_alive = await self._read_h1_request(head, reader, writer, info)
            except _BadRequest as exc:
                await self._h1_simple(writer, 400, str(exc))
                return
            self._record(req)
            resp = await self._route(req)
            await self._write_h1(writer, req, resp, keep_alive)
            if not keep_alive:
                return

    async def _read_h1_request(
        self,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        info: dict[str, Any],
    ) -> tuple[dict[str, Any], bool]:
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[0].isalpha():
            raise _BadRequest(f"bad request line {lines[0][:100]!r}")
        method, target, version = parts
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(f"bad header line {line[:100]!r}")
            headers.append((name, value.strip()))
        lower = {}
        for name, value in headers:
            lower.setdefault(name.lower(), []).append(value)
        if lower.get("expect", [""])[0].lower() == "100-continue" and version == "HTTP/1.1":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await self._read_h1_body(lower, reader)
        connection = ",".join(lower.get("connection", [])).lower()
        keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        req = {
            "method": method,
            "path": target,
            "headers": headers,
            "body": body,
            "http_version": version.removeprefix("HTTP/"),
            "sni": info["sni"],
            "authority": lower.get("host", [None])[0],
            "scheme": "https",
            "client": info["client"],
            "server": self.name,
            "time": time.time(),
        }
        return req, keep_alive

    @staticmethod
    async def _read_h1_body(lower: dict[str, list[str]], reader: asyncio.StreamReader) -> bytes:
        te = ",".join(lower.get("transfer-encoding", [])).lower()
        if te:
            if te.strip() != "chunked":
                raise _BadRequest(f"unsupported transfer-encoding {te!r}")
            body = bytearray()
            while True:
                size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), _IDLE_TIMEOUT)
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _BadRequest("bad chunk size") from None
                if size == 0:
                    while (await asyncio.wait_for(reader.readuntil(b"\r\n"), _IDLE_TIMEOUT)) != b"\r\n":
                        pass  # trailers
                    return bytes(body)
                if len(body) + size > MAX_BODY:
                    raise _BadRequest("body too large")
                body += await asyncio.wait_for(reader.readexactly(size), _IDLE_TIMEOUT)
                if await reader.readexactly(2) != b"\r\n":
                    raise _BadRequest("bad chunk terminator")
        lengths = set(lower.get("content-length", []))
        if not lengths:
            return b""
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise _BadRequest("bad content-length")
        length = int(next(iter(lengths)))
        if length > MAX_BODY:
            raise _BadRequest("body too large")
        return await asyncio.wait_for(reader.readexactly(length), _IDLE_TIMEOUT)

    @staticmethod
    async def _h1_simple(writer: asyncio.StreamWriter, status: int, text: str) -> None:
        body = (text + "\n").encode()
        writer.write(
            f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    async def _write_h1(
        self, writer: asyncio.StreamWriter, req: dict[str, Any], resp: _Response, keep_alive: bool
    ) -> None:
        version = req["http_version"]
        no_body = req["method"] == "HEAD" or resp.status in (204, 304)
        lines = [
            f"HTTP/{version} {resp.status} {_reason(resp.status)}",
            *(f"{k}: {v}" for k, v in resp.headers),
        ]
        chunked = False
        if resp.stream_len is not None or resp.pieces is not None:
            if version == "1.1":
                chunked = True
                lines.append("Transfer-Encoding: chunked")
            else:
                keep_alive = False
        elif resp.status not in (204, 304):
            lines.append(f"Content-Length: {len(resp.body)}")
        if not keep_alive:
            lines.append("Connection: close")
        elif version == "1.0":
            lines.append("Connection: keep-alive")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not no_body:
            async for piece in resp.chunks():
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
        await writer.drain()

    # --------------------------------------------------------------------------------------- HTTP/2
    async def _serve_h2(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, info: dict[str, Any], initial: bytes
    ) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        flow = {"event": asyncio.Event()}  # replaced each time the window grows, waiters hold the old one
        streams: dict[int, dict[str, Any]] = {}
        tasks: dict[int, asyncio.Task[None]] = {}

        def flush() -> None:
            data = conn.data_to_send()
            if data:
                writer.write(data)

        def window_grew() -> None:
            old, flow["event"] = flow["event"], asyncio.Event()
            old.set()

        async def respond(stream_id: int) -> None:
            st = streams.pop(stream_id)
            try:
                req = self._h2_request(st, info)
                self._record(req)
                resp = await self._route(req)
                await self._send_h2(conn, writer, stream_id, req, resp, flow, flush)
            except (h2.exceptions.StreamClosedError, ConnectionError):
                pass
            except h2.exceptions.ProtocolError:
                with contextlib.suppress(h2.exceptions.H2Error):
                    conn.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    flush()
            finally:
                tasks.pop(stream_id, None)

        data = initial
        try:
            while True:
                if data:
                    try:
                        events = conn.receive_data(data)
                    except h2.exceptions.ProtocolError:
                        flush()
                        await writer.drain()
                        return
                    for ev in events:
                        if isinstance(ev, h2.events.RequestReceived):
                            streams[ev.stream_id] = {"headers": list(ev.headers or []), "body": bytearray()}
                        elif isinstance(ev, h2.events.DataReceived):
                            st = streams.get(ev.stream_id)
                            if st is not None and ev.data:
                                if len(st["body"]) + len(ev.data) > MAX_BODY:
                                    streams.pop(ev.stream_id, None)
                                    conn.reset_stream(ev.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                                else:
                                    st["body"] += ev.data
                            if ev.flow_controlled_length:
                                with contextlib.suppress(h2.exceptions.StreamClosedError):
                                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                        elif isinstance(ev, h2.events.StreamEnded):
                            if ev.stream_id in streams and ev.stream_id not in tasks:
                                tasks[ev.stream_id] = asyncio.create_task(respond(ev.stream_id))
                        elif isinstance(ev, h2.events.StreamReset):
                            streams.pop(ev.stream_id, None)
                            task = tasks.pop(ev.stream_id, None)
                            if task is not None:
                                task.cancel()
                            window_grew()
                        elif isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                            window_grew()
                        elif isinstance(ev, h2.events.ConnectionTerminated):
                            flush()
                            await writer.drain()
                            return
                    flush()
                    await writer.drain()
                data = await asyncio.wait_for(reader.read(65536), _IDLE_TIMEOUT)
                if not data:
                    return
        finally:
            for task in list(tasks.values()):
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)

    def _h2_request(self, st: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        pseudo: dict[str, str] = {}
        headers: list[tuple[str, str]] = []
        for raw_name, raw_value in st["headers"]:
            name = raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name
            value = raw_value.decode("latin-1") if isinstance(raw_value, bytes) else raw_value
            if name.startswith(":"):
                pseudo[name] = value
            else:
                headers.append((name, value))
        return {
            "method": pseudo.get(":method", ""),
            "path": pseudo.get(":path", ""),
            "headers": headers,
            "body": bytes(st["body"]),
            "http_version": "2",
            "sni": info["sni"],
            "authority": pseudo.get(":authority"),
            "scheme": pseudo.get(":scheme"),
            "client": info["client"],
            "server": self.name,
            "time": time.time(),
        }

    @staticmethod
    async def _send_h2(
        conn: h2.connection.H2Connection,
        writer: asyncio.StreamWriter,
        stream_id: int,
        req: dict[str, Any],
        resp: _Response,
        flow: dict[str, asyncio.Event],
        flush: Callable[[], None],
    ) -> None:
        no_body = req["method"] == "HEAD" or resp.status in (204, 304)
        headers = [(":status", str(resp.status))]
        headers += [(k.lower(), v) for k, v in resp.headers]
        streamed = resp.stream_len is not None or resp.pieces is not None
        if not streamed and resp.status not in (204, 304):
            headers.append(("content-length", str(len(resp.body))))
        if no_body or (not streamed and not resp.body):
            conn.send_headers(stream_id, headers, end_stream=True)
            flush()
            await writer.drain()
            return
        conn.send_headers(stream_id, headers)
        flush()
        async for piece in resp.chunks():
            view = memoryview(piece)
            while view:
                event = flow["event"]
                window = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
                if window <= 0:
                    await asyncio.wait_for(event.wait(), _IDLE_TIMEOUT)
                    continue
                conn.send_data(stream_id, bytes(view[:window]))
                view = view[window:]
                flush()
                await writer.drain()
        conn.end_stream(stream_id)
        flush()
        await writer.drain()

    # --------------------------------------------------------------------------------------- routing
    async def _route(self, req: dict[str, Any]) -> _Response:
        path, _, query = req["path"].partition("?")
        base = [("X-Upstream", self.name)]
        try:
            if path.startswith("/status/"):
                code = int(path.removeprefix("/status/"))
                if not 200 <= code <= 599:
                    raise ValueError(code)
                body = b"" if code in (204, 304) else f"status {code}\n".encode()
                return _Response(code, [*base, ("Content-Type", "text/plain")], body)
            if path == "/redirect":
                params = dict(parse_qsl(query, keep_blank_values=True))
                code = int(params.get("status", "302"))
                if "to" not in params or not 300 <= code <= 399:
                    raise ValueError(query)
                body = f"redirecting to {params['to']}\n".encode()
                headers = [*base, ("Location", params["to"]), ("Content-Type", "text/plain")]
                return _Response(code, headers, body)
            if path.startswith("/bytes/"):
                n = int(path.removeprefix("/bytes/"))
                if not 0 <= n <= MAX_BODY:
                    raise ValueError(n)
                return _Response(200, [*base, ("Content-Type", "application/octet-stream")], stream_len=n)
            if path.startswith("/slow/"):
                delay = float(path.removeprefix("/slow/"))
                if not 0 <= delay <= MAX_SLOW:
                    raise ValueError(delay)
                await asyncio.sleep(delay)
            if path == "/response-headers":
                base += parse_qsl(query, keep_blank_values=True)
            if path.startswith("/reflect"):
                return self._reflect(req, query, base)
        except ValueError:
            return _Response(400, [*base, ("Content-Type", "text/plain")], f"bad {req['path']}\n".encode())
        return self._echo(req, query, base)

    def _echo(self, req: dict[str, Any], query: str, base: list[tuple[str, str]]) -> _Response:
        joined: dict[str, str] = {}
        for name, value in req["headers"]:
            key = name.lower()
            sep = "; " if key == "cookie" else ", "
            joined[key] = joined[key] + sep + value if key in joined else value
        doc = {
            "server": self.name,
            "method": req["method"],
            "path": req["path"],
            "query": query,
            "headers": joined,
            "authority": req["authority"],
            "body_len": len(req["body"]),
            "http_version": req["http_version"],
            "sni": req["sni"],
        }
        body = json.dumps(doc).encode()
        return _Response(200, [*base, ("Content-Type", "application/json")], body)


    def _reflect(self, req: dict[str, Any], query: str, base: list[tuple[str, str]]) -> _Response:
        """Everything the request carried, given back every way a leak could happen: the echo plus base64 and
        percent-encoded forms of each header value, the path and the query, also as response headers; then
        optionally compressed (encoding=gzip|deflate|br|zstd), repeated to a large body (size=N), and sent in
        separate pieces of `split` bytes so a value straddles piece boundaries."""
        params = dict(parse_qsl(query, keep_blank_values=True))
        echo = json.loads(self._echo(req, query, base).body)
        values = {**{f"h-{name.lower()}": value for name, value in req["headers"]},
                  "path": req["path"], "query": query}
        echo["base64"] = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        echo["percent"] = {k: quote(v, safe="") for k, v in values.items()}
        body = json.dumps(echo).encode()
        size = min(int(params.get("size", "0")), MAX_BODY)
        if size > len(body):
            body = (body + b"\n") * (size // (len(body) + 1) + 1)
        headers = [*base, ("Content-Type", "application/json")]
        headers += [(f"X-Reflect-{name}", value) for name, value in req["headers"]
                    if name.lower() not in ("host", "content-length", "transfer-encoding", "connection")]
        encoding = params.get("encoding", "identity")
        if encoding != "identity":
            body = _compress(encoding, body)
            headers.append(("Content-Encoding", encoding))
        if params.get("corrupt"):  # garbage from the middle on: a stream that breaks after it started
            body = body[: len(body) // 2] + bytes(255 - b for b in body[len(body) // 2:])
        split = max(int(params.get("split", "0")), 0) or len(body) or 1
        return _Response(200, headers, pieces=[body[i:i + split] for i in range(0, len(body), split)])


def _compress(encoding: str, body: bytes) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body)
    if encoding == "deflate":
        return zlib.compress(body)
    if encoding == "br":
        return brotli.compress(body)
    if encoding == "zstd":
        return zstd.compress(body)
    raise ValueError(encoding)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class TcpOnly(_Bound):
    """A TCP listener on ``ip``:``port`` that accepts and closes at once (TLS to it fails)."""

    def __init__(self, ip: str = "127.0.0.11", port: int = 443) -> None:
        self.ip = ip
        self._requested_port = port
        self._port: int | None = None
        self._accepts = 0
        self._lock = threading.Lock()
        self._lt = LoopThread(f"TcpOnly-{ip}:{port}")
        self._server: asyncio.Server | None = None

    async def _handle(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self._accepts += 1
        writer.close()

    def start(self) -> Self:
        self._lt.start()

        async def bind() -> asyncio.Server:
            return await asyncio.start_server(
                self._handle, host=self.ip, port=self._requested_port, reuse_address=True
            )

        self._bind(bind)
        return self

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()

    def stop(self) -> None:
        self._lt.stop(self._shutdown)

    @property
    def accepts(self) -> int:
        """Connections accepted (and closed) so far."""
        with self._lock:
            return self._accepts

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
