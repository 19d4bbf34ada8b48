"""A real WebSocket upstream over TLS (wsproto): it echoes every message and, first, sends the request's
Authorization header back as a message, so tests can see what a run could read of a secret."""

import socket
import ssl
import threading
from typing import Self

import trustme
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

TIMEOUT = 10.0


class WebSocketUpstream:
    def __init__(self, ip: str, ca: trustme.CA, hostnames: tuple[str, ...], port: int = 443) -> None:
        self.address = (ip, port)
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*hostnames).configure_cert(self._context)
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.received: list[str] = []

    def start(self) -> Self:
        self._listener = socket.create_server(self.address)
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(TIMEOUT)
        if self._listener is not None:
            self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            thread.start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(TIMEOUT)
        try:
            with self._context.wrap_socket(raw, server_side=True) as sock:
                ws = WSConnection(ConnectionType.SERVER)
                while not self._stop.is_set():
                    data = sock.recv(65536)
                    if not data:
                        return
                    ws.receive_data(data)
                    for event in ws.events():
                        if isinstance(event, Request):
                            sock.sendall(ws.send(AcceptConnection()))
                            authorization = next((v.decode() for k, v in event.extra_headers
                                                  if k.lower() == b"authorization"), "")
                            sock.sendall(ws.send(Message(data=f"authorization={authorization}")))
                        elif isinstance(event, TextMessage):
                            self.received.append(event.data)
                            sock.sendall(ws.send(Message(data=f"echo:{event.data}")))
                        elif isinstance(event, Ping):
                            sock.sendall(ws.send(event.response()))
                        elif isinstance(event, CloseConnection):
                            sock.sendall(ws.send(event.response()))
                            return
        except (OSError, ssl.SSLError):
            return


def websocket_exchange(sock: ssl.SSLSocket, host: str, path: str, headers: list[tuple[str, str]],
                       messages: list[str]) -> tuple[int, list[str]]:
    """A client handshake and messages over an open TLS socket: (handshake status, messages received)."""
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host=host, target=path, extra_headers=headers)))
    received: list[str] = []
    status = 0
    pending = list(messages)
    while True:
        data = sock.recv(65536)
        if not data:
            return status, received
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                status = 101
            elif isinstance(event, RejectConnection):
                return event.status_code, received
            elif isinstance(event, TextMessage):
                received.append(event.data)
                if pending:
                    sock.sendall(ws.send(Message(data=pending.pop(0))))
                elif len(received) > len(messages):
                    sock.sendall(ws.send(CloseConnection(code=1000)))
            elif isinstance(event, CloseConnection):
                return status, received
