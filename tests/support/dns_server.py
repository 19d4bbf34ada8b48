"""A scripted DNS server for tests: real UDP and TCP on one port, answers set per name by the test.

Usage::

    with ScriptedDNS() as dns:                      # 127.0.0.53, a free port
        dns.add("api.example.test", "127.0.0.10", "::1")
        dns.cname("www.example.test", "api.example.test")
        dns.rebinding("evil.test", [["127.0.0.10"], ["127.0.0.99"]])
        ...  # point the code under test at dns.server_spec ("127.0.0.53:PORT")
        assert dns.queried("api.example.test")

Behaviour, in the order the server applies it for one question (qname, qtype):

* Names match case-insensitively, with or without a trailing dot.  Scripting a name again replaces
  what it had (``add`` twice does not merge).
* ``cname`` names answer with the CNAME and then, like a recursive resolver, follow the chain through
  the server's own script, appending the target's records of the asked type to the same answer.
  The rcode is the rcode of the end of the chain (a chain ending in an ``nxdomain`` name gives
  NXDOMAIN with the CNAMEs in the answer; ending in ``servfail`` gives SERVFAIL and no answer;
  ending in ``timeout`` drops the query).  Loops and chains longer than 16 give SERVFAIL.
  A question of type CNAME gets only the first CNAME.
* Address names answer A questions with their IPv4 addresses and AAAA questions with their IPv6
  ones; a type with no address, and any other type (MX, TXT, ...), is NOERROR with an empty answer
  (NODATA).  ANY gets both A and AAAA.
* ``rebinding`` names count queries **per query type**: the i-th A question (0-based, counted
  from when the name was scripted, including questions that reach it through a CNAME) gets
  ``sets[i % len(sets)]`` (or the last set for good once exhausted if ``cycle=False``); AAAA
  questions have a counter of their own, so a resolver that asks A and AAAA for one lookup sees
  both from the same set.  Other types do not advance a counter.
* Unknown names get the default outcome: NXDOMAIN unless the constructor's ``default`` (or
  :meth:`set_default`) says ``"servfail"``, ``"refused"``, ``"timeout"`` or ``"noerror"`` (NODATA).
* NXDOMAIN and NODATA answers carry a root SOA with TTL 0 and minimum 0 in the authority section,
  so resolvers do not cache negative answers.
* Over UDP a response larger than the client's EDNS payload size (512 without EDNS) is sent
  truncated (TC=1, empty sections) so the client retries over TCP; TCP answers are never truncated.
* Opcodes other than QUERY get NOTIMP, classes other than IN get REFUSED, packets that do not parse
  are dropped.

Every question received (including dropped and timed-out ones) is logged in :attr:`queries`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from tests.support.loop_thread import LoopThread

__all__ = ["DefaultOutcome", "QueryRecord", "ScriptedDNS"]

DefaultOutcome = Literal["nxdomain", "servfail", "refused", "timeout", "noerror"]

_MAX_CHAIN = 16
_TCP_IDLE_TIMEOUT = 30.0
_ROOT_SOA = "a.root.test. hostmaster.root.test. 1 3600 600 86400 0"


def _norm(name: str | dns.name.Name) -> str:
    text = name.to_text() if isinstance(name, dns.name.Name) else name
    return text.strip().rstrip(".").lower()


def _split_ips(ips: Iterable[str]) -> tuple[list[str], list[str]]:
    v4: list[str] = []
    v6: list[str] = []
    for ip in ips:
        addr = ipaddress.ip_address(ip)  # ValueError on garbage, at scripting time
        (v4 if addr.version == 4 else v6).append(addr.compressed)
    return v4, v6


@dataclass(frozen=True)
class QueryRecord:
    """One question as received: qname lowercase without trailing dot, qtype text, transport."""

    qname: str
    qtype: str
    transport: Literal["udp", "tcp"]
    time: float


@dataclass
class _Entry:
    kind: Literal["addr", "cname", "nxdomain", "servfail", "timeout", "rebind"]
    ttl: int = 60
    v4: list[str] = field(default_factory=list)
    v6: list[str] = field(default_factory=list)
    target: str = ""
    sets: list[tuple[list[str], list[str]]] = field(default_factory=list)
    cycle: bool = True
    counters: dict[str, int] = field(default_factory=dict)


@dataclass
class _Outcome:
    rcode: int
    answer: list[dns.rrset.RRset]


class ScriptedDNS:
    """A DNS server on ``host``:``port`` (UDP and TCP, same port; port 0 picks a free one)."""

    def __init__(self, host: str = "127.0.0.53", port: int = 0, *, default: DefaultOutcome = "nxdomain"):
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._default: DefaultOutcome = default
        self._lock = threading.Lock()
        self._query_cond = threading.Condition(self._lock)
        self._entries: dict[str, _Entry] = {}
        self._log: list[QueryRecord] = []
        self._lt = LoopThread("ScriptedDNS")
        self._udp_transport: asyncio.DatagramTransport | None = None
        self._tcp_server: asyncio.Server | None = None
        self._tcp_tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------------------------- lifecycle
    @property
    def address(self) -> tuple[str, int]:
        if self._port is None:
            raise RuntimeError("ScriptedDNS is not started")
        return (self.host, self._port)

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def server_spec(self) -> str:
        host, port = self.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> Self:
        if self._lt.thread is not None:
            raise RuntimeError("ScriptedDNS already started")
        udp_sock, tcp_sock = self._bind_pair()
        self._port = udp_sock.getsockname()[1]
        self._lt.name = f"ScriptedDNS-{self.server_spec}"
        self._lt.start()
        self._lt.run(self._serve(udp_sock, tcp_sock))
        return self

    def _bind_pair(self) -> tuple[socket.socket, socket.socket]:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        last_error: OSError | None = None
        for _ in range(50):
            udp = socket.socket(family, socket.SOCK_DGRAM)
            tcp = socket.socket(family, socket.SOCK_STREAM)
            try:
                udp.bind((self.host, self._requested_port))
                port = udp.getsockname()[1]
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                tcp.bind((self.host, port))
                tcp.listen(64)
            except OSError as exc:
                udp.close()
                tcp.close()
                last_error = exc
                if self._requested_port:
                    raise
                continue
            udp.setblocking(False)
            tcp.setblocking(False)
            return udp, tcp
        raise RuntimeError(f"could not bind UDP and TCP on one port at {self.host}") from last_error

    async def _serve(self, udp_sock: socket.socket, tcp_sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _UDPProtocol(self), sock=udp_sock)
        self._udp_transport = transport
        self._tcp_server = await asyncio.start_server(self._handle_tcp, sock=tcp_sock)

    def stop(self) -> None:
        self._lt.stop(self._shutdown)

    async def _shutdown(self) -> None:
        if self._udp_transport is not None:
            self._udp_transport.close()
        if self._tcp_server is not None:
            self._tcp_server.close()
        for task in list(self._tcp_tasks):
            task.cancel()
        await asyncio.gather(*self._tcp_tasks, return_exceptions=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------ scripting
    def _put(self, name: str, entry: _Entry) -> None:
        with self._lock:
            self._entries[_norm(name)] = entry

    def add(self, name: str, *ips: str, ttl: int = 60) -> None:
        """Answer A with the IPv4 ones of ``ips`` and AAAA with the IPv6 ones (NODATA where none)."""
        v4, v6 = _split_ips(ips)
        self._put(name, _Entry("addr", ttl=ttl, v4=v4, v6=v6))

    def cname(self, name: str, target: str, ttl: int = 60) -> None:
        """Answer with ``name CNAME target`` plus whatever ``target`` resolves to here."""
        self._put(name, _Entry("cname", ttl=ttl, target=_norm(target)))

    def nxdomain(self, name: str) -> None:
        self._put(name, _Entry("nxdomain"))

    def servfail(self, name: str) -> None:
        self._put(name, _Entry("servfail"))

    def timeout(self, name: str) -> None:
        """Never answer ``name`` (the query is logged, then dropped)."""
        self._put(name, _Entry("timeout"))

    def rebinding(
        self, name: str, sets: Sequence[Sequence[str]], ttl: int = 0, *, cycle: bool = True
    ) -> None:
        """Successive queries of each type get successive address sets (see the module docstring)."""
        if not sets:
            raise ValueError("rebinding needs at least one set of addresses")
        self._put(name, _Entry("rebind", ttl=ttl, sets=[_split_ips(s) for s in sets], cycle=cycle))

    def remove(self, name: str) -> None:
        with self._lock:
            self._entries.pop(_norm(name), None)

    def set_default(self, default: DefaultOutcome) -> None:
        """What unknown names get."""
        with self._lock:
            self._default = default

    def clear(self) -> None:
        """Forget every scripted name (and rebinding counters) and the query log."""
        with self._lock:
            self._entries.clear()
            self._log.clear()

    def clear_queries(self) -> None:
        with self._lock:
            self._log.clear()

    # ------------------------------------------------------------------------------------ inspection
    @property
    def queries(self) -> list[tuple[str, str]]:
        """Every question received so far, as (qname lowercase without trailing dot, qtype text)."""
        with self._lock:
            return [(q.qname, q.qtype) for q in self._log]

    @property
    def query_log(self) -> list[QueryRecord]:
        with self._lock:
            return list(self._log)

    def queried(self, name: str, qtype: str | None = None) -> bool:
        return self.query_count(name, qtype) > 0

    def query_count(self, name: str, qtype: str | None = None) -> int:
        want = _norm(name)
        with self._lock:
            return sum(
                1 for q in self._log if q.qname == want and (qtype is None or q.qtype == qtype.upper())
            )

    def wait_for_query(self, name: str, qtype: str | None = None, timeout: float = 5.0) -> bool:
        """Block until ``name`` (of ``qtype``, if given) has been asked; False on timeout."""
        want = _norm(name)
        deadline = time.monotonic() + timeout
        with self._query_cond:
            while True:
                if any(q.qname == want and (qtype is None or q.qtype == qtype.upper()) for q in self._log):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._query_cond.wait(remaining)

    # ------------------------------------------------------------------------------------- answering
    def _respond(self, wire: bytes, transport: Literal["udp", "tcp"]) -> bytes | None:
        """The wire response to one query message, or None to send nothing."""
        try:
            query = dns.message.from_wire(wire)
        except Exception:
            return None
        if query.flags & dns.flags.QR:
            return None  # a response, not a query
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        if query.opcode() != dns.opcode.QUERY:
            response.set_rcode(dns.rcode.NOTIMP)
            return self._to_wire(query, response, transport)
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return self._to_wire(query, response, transport)
        question = query.question[0]
        qtype_text = dns.rdatatype.to_text(question.rdtype)
        with self._query_cond:
            self._log.append(QueryRecord(_norm(question.name), qtype_text, transport, time.time()))
            self._query_cond.notify_all()
        if question.rdclass != dns.rdataclass.IN:
            response.set_rcode(dns.rcode.REFUSED)
            return self._to_wire(query, response, transport)
        with self._lock:
            outcome = self._resolve(question.name, question.rdtype)
        if outcome is None:
            return None
        response.set_rcode(outcome.rcode)
        if outcome.rcode != dns.rcode.SERVFAIL and outcome.rcode != dns.rcode.REFUSED:
            response.answer.extend(outcome.answer)
            if outcome.rcode == dns.rcode.NXDOMAIN or not any(
                rr.rdtype == question.rdtype or question.rdtype == dns.rdatatype.ANY for rr in outcome.answer
            ):
                response.authority.append(dns.rrset.from_text(".", 0, "IN", "SOA", _ROOT_SOA))
        return self._to_wire(query, response, transport)

    @staticmethod
    def _to_wire(query: dns.message.Message, response: dns.message.Message, transport: str) -> bytes:
        if transport == "tcp":
            return response.to_wire(max_size=65535)
        limit = max(512, query.payload) if query.edns >= 0 else 512
        try:
            return response.to_wire(max_size=limit)
        except dns.exception.TooBig:
            response.answer.clear()
            response.authority.clear()
            response.additional.clear()
            response.flags |= dns.flags.TC
            return response.to_wire(max_size=limit)

    def _resolve(self, qname: dns.name.Name, qtype: int) -> _Outcome | None:
        """Walk the script from ``qname``; None means drop the query.  Caller holds the lock."""
        answer: list[dns.rrset.RRset] = []
        owner = qname  # owner names keep the case the client used for the first hop
        seen: set[str] = set()
        for _ in range(_MAX_CHAIN):
            key = _norm(owner)
            if key in seen:
                return _Outcome(dns.rcode.SERVFAIL, [])
            seen.add(key)
            entry = self._entries.get(key)
            if entry is None:
                return self._default_outcome(answer)
            if entry.kind == "timeout":
                return None
            if entry.kind == "servfail":
                return _Outcome(dns.rcode.SERVFAIL, [])
            if entry.kind == "nxdomain":
                return _Outcome(dns.rcode.NXDOMAIN, answer)
            if entry.kind == "cname":
                target = dns.name.from_text(entry.target)
                answer.append(dns.rrset.from_text(owner, entry.ttl, "IN", "CNAME", target.to_text()))
                if qtype == dns.rdatatype.CNAME:
                    return _Outcome(dns.rcode.NOERROR, answer)
                owner = target
                continue
            if entry.kind == "rebind":
                v4, v6 = self._rebind_pick(entry, qtype)
            else:
                v4, v6 = entry.v4, entry.v6
            if qtype in (dns.rdatatype.A, dns.rdatatype.ANY) and v4:
                answer.append(dns.rrset.from_text_list(owner, entry.ttl, "IN", "A", v4))
            if qtype in (dns.rdatatype.AAAA, dns.rdatatype.ANY) and v6:
                answer.append(dns.rrset.from_text_list(owner, entry.ttl, "IN", "AAAA", v6))
            return _Outcome(dns.rcode.NOERROR, answer)
        return _Outcome(dns.rcode.SERVFAIL, [])

    @staticmethod
    def _rebind_pick(entry: _Entry, qtype: int) -> tuple[list[str], list[str]]:
        if qtype not in (dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.ANY):
            return [], []
        key = dns.rdatatype.to_text(qtype)
        index = entry.counters.get(key, 0)
        entry.counters[key] = index + 1
        index = index % len(entry.sets) if entry.cycle else min(index, len(entry.sets) - 1)
        return entry.sets[index]

    def _default_outcome(self, answer: list[dns.rrset.RRset]) -> _Outcome | None:
        match self._default:
            case "timeout":
                return None
            case "servfail":
                return _Outcome(dns.rcode.SERVFAIL, [])
            case "refused":
                return _Outcome(dns.rcode.REFUSED, [])
            case "noerror":
                return _Outcome(dns.rcode.NOERROR, answer)
            case _:
                return _Outcome(dns.rcode.NXDOMAIN, answer)

    # ------------------------------------------------------------------------------------ transports
    async def _handle_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tcp_tasks.add(task)
        try:
            while True:
                try:
                    header = await asyncio.wait_for(reader.readexactly(2), _TCP_IDLE_TIMEOUT)
                    (length,) = struct.unpack("!H", header)
                    wire = await asyncio.wait_for(reader.readexactly(length), _TCP_IDLE_TIMEOUT)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                try:
                    reply = self._respond(wire, "tcp")
                except Exception:
                    reply = None  # never let one odd message take the server down
                if reply is not None:
                    writer.write(struct.pack("!H", len(reply)) + reply)
                    await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            self._tcp_tasks.discard(task)
            writer.close()


class _UDPProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: ScriptedDNS) -> None:
        self._server = server
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self._transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            reply = self._server._respond(data, "udp")
        except Exception:
            return  # never let one odd packet take the server down
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        pass
