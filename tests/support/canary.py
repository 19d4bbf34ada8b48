"""Canary listeners: prove the code under test never reaches an address it must not.

Usage::

    with Canary([("127.0.0.99", 443), ("127.0.0.99", 80)], udp_addresses=[("127.0.0.99", 53)]) as canary:
        ...  # drive the proxy at something that resolves to 127.0.0.99
        canary.assert_untouched()

TCP listeners accept every connection, record it and close it at once; UDP listeners record every
datagram (with its first 512 bytes).  Reading :attr:`Canary.hits` or calling
:meth:`Canary.assert_untouched` first collects, synchronously, any connection or datagram the
kernel has already queued, so a connect that returned just before the check is never missed.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

__all__ = ["Canary", "Hit"]

_JOIN_TIMEOUT = 5.0


@dataclass(frozen=True)
class Hit:
    proto: Literal["tcp", "udp"]
    address: tuple[str, int]  # the canary listener that was reached
    peer: tuple[str, int]  # who reached it
    time: float
    data: bytes = b""  # UDP: the datagram's first 512 bytes

    def __str__(self) -> str:
        extra = f" ({len(self.data)} bytes: {self.data[:32]!r})" if self.proto == "udp" else ""
        return f"{self.proto} {self.address[0]}:{self.address[1]} from {self.peer[0]}:{self.peer[1]}{extra}"


class Canary:
    """TCP (and optionally UDP) listeners that record every attempt to reach them."""

    def __init__(
        self,
        addresses: Iterable[tuple[str, int]] = (("127.0.0.99", 443), ("127.0.0.99", 80)),
        *,
        udp_addresses: Iterable[tuple[str, int]] = (),
    ) -> None:
        self._tcp_wanted = list(addresses)
        self._udp_wanted = list(udp_addresses)
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._sockets: list[tuple[Literal["tcp", "udp"], socket.socket, tuple[str, int]]] = []
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    # ----------------------------------------------------------------------------------- lifecycle
    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("Canary already started")
        try:
            for host, port in self._tcp_wanted:
                sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
                self._sockets.append(("tcp", sock, (host, port)))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(128)
            for host, port in self._udp_wanted:
                sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
                self._sockets.append(("udp", sock, (host, port)))
                sock.bind((host, port))
        except OSError:
            self._close_sockets()
            raise
        self._sockets = [(proto, s, s.getsockname()[:2]) for proto, s, _ in self._sockets]
        self._selector = selectors.DefaultSelector()
        for _proto, sock, _addr in self._sockets:
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="Canary", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        self._thread.join(_JOIN_TIMEOUT)
        self._thread = None
        self._sweep()  # keep whatever arrived up to the end
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._wake_r = self._wake_w = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        for _proto, sock, _addr in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------- watching
    def _run(self) -> None:
        while not self._stopping.is_set():
            selector = self._selector
            if selector is None:
                return
            try:
                selector.select(timeout=0.5)
            except (OSError, ValueError):
                return
            self._sweep()

    def _sweep(self) -> None:
        """Collect every queued connection and datagram without blocking."""
        with self._lock:
            for proto, sock, addr in self._sockets:
                if sock.fileno() < 0:
                    continue
                while True:
                    try:
                        if proto == "tcp":
                            conn, peer = sock.accept()
                            with contextlib.suppress(OSError):
                                conn.close()
                            self._hits.append(Hit("tcp", addr, peer[:2], time.time()))
                        else:
                            data, peer = sock.recvfrom(65535)
                            self._hits.append(Hit("udp", addr, peer[:2], time.time(), data[:512]))
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        break
            if self._wake_r is not None and self._wake_r.fileno() >= 0:
                with contextlib.suppress(OSError):
                    self._wake_r.setblocking(False)
                    self._wake_r.recv(4096)

    # ------------------------------------------------------------------------------------ inspection
    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound TCP listener addresses (ports resolved if 0 was asked)."""
        return [addr for proto, _s, addr in self._sockets if proto == "tcp"]

    @property
    def udp_addresses(self) -> list[tuple[str, int]]:
        return [addr for proto, _s, addr in self._sockets if proto == "udp"]

    @property
    def hits(self) -> list[Hit]:
        self._sweep()
        with self._lock:
            return list(self._hits)

    def clear(self) -> None:
        self._sweep()
        with self._lock:
            self._hits.clear()

    def assert_untouched(self) -> None:
        hits = self.hits
        if hits:
            listed = "; ".join(str(h) for h in hits)
            raise AssertionError(f"canary reached {len(hits)} time(s): {listed}")
