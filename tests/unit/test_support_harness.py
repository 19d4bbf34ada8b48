"""Self-tests of the test-support servers (tests/support): DNS, HTTPS upstreams, canaries.

These bind 127.0.1.x addresses on ports 53/443/80 (the integration fixtures hold 127.0.0.x), so they run
only inside the isolated network namespace that scripts/test sets up (nothing but ``lo``).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import dns.exception
import dns.flags
import dns.message
import dns.rdatatype
import dns.resolver
import pytest
import trustme

from tests.support.canary import Canary
from tests.support.dns_server import ScriptedDNS
from tests.support.netns import require_isolated_netns
from tests.support.upstream import HttpsUpstream, TcpOnly, expected_bytes, make_test_ca, write_ca_pem


@pytest.fixture(scope="module", autouse=True)
def _isolated_netns() -> None:
    require_isolated_netns()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return make_test_ca()


@pytest.fixture(scope="module")
def ca_pem(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ca_pem(ca, tmp_path_factory.mktemp("ca") / "ca.pem")


@pytest.fixture(scope="module")
def upstream(ca: trustme.CA) -> Iterator[HttpsUpstream]:
    with HttpsUpstream(ip="127.0.1.10", port=443, ca=ca, hostnames=("api.example.test",), name="up1") as up:
        yield up


@pytest.fixture
def dns_server() -> Iterator[ScriptedDNS]:
    with ScriptedDNS() as server:
        yield server


def _resolver(server: ScriptedDNS, lifetime: float = 2.0) -> dns.resolver.Resolver:
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = [server.host]
    resolver.port = server.port
    resolver.lifetime = lifetime
    resolver.cache = None
    return resolver


def _addresses(answer: dns.resolver.Answer) -> list[str]:
    return sorted(rr.address for rr in answer)


def _client_ctx(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


def _https(ca: trustme.CA, ip: str, server_name: str, port: int = 443) -> http.client.HTTPSConnection:
    """An HTTPS connection to ip:port presenting SNI ``server_name`` (and verifying the cert for it)."""
    conn = http.client.HTTPSConnection(server_name, port, context=_client_ctx(ca), timeout=5)
    raw = socket.create_connection((ip, port), timeout=5)
    conn.sock = _client_ctx(ca).wrap_socket(raw, server_hostname=server_name)
    return conn


# ----------------------------------------------------------------------------------------------- DNS
def test_dns_udp_and_tcp_answers(dns_server: ScriptedDNS) -> None:
    dns_server.add("API.Example.Test.", "127.0.0.10", "127.0.0.11", "::1")
    resolver = _resolver(dns_server)
    assert dns_server.server_spec == f"127.0.0.53:{dns_server.port}"
    for tcp in (False, True):
        assert _addresses(resolver.resolve("api.example.test", "A", tcp=tcp)) == ["127.0.0.10", "127.0.0.11"]
        assert _addresses(resolver.resolve("api.example.test.", "AAAA", tcp=tcp)) == ["::1"]
    assert [q.transport for q in dns_server.query_log] == ["udp", "udp", "tcp", "tcp"]
    assert dns_server.queries[0] == ("api.example.test", "A")
    assert dns_server.queried("API.example.test") and not dns_server.queried("other.test")

    dns_server.add("v4only.test", "127.0.0.12")
    with pytest.raises(dns.resolver.NoAnswer):
        resolver.resolve("v4only.test", "AAAA")
    with pytest.raises(dns.resolver.NXDOMAIN):
        resolver.resolve("unknown.test", "A")
    dns_server.nxdomain("gone.test")
    with pytest.raises(dns.resolver.NXDOMAIN):
        resolver.resolve("gone.test", "A", tcp=True)
    dns_server.servfail("broken.test")
    with pytest.raises(dns.resolver.NoNameservers):
        resolver.resolve("broken.test", "A")
    dns_server.timeout("black.hole.test")
    with pytest.raises(dns.exception.Timeout):
        _resolver(dns_server, lifetime=0.3).resolve("black.hole.test", "A")
    assert dns_server.queried("black.hole.test")


def test_dns_cname_chain_followed_in_one_response(dns_server: ScriptedDNS) -> None:
    dns_server.cname("www.example.test", "edge.cdn.test")
    dns_server.cname("edge.cdn.test", "node7.cdn.test.")
    dns_server.add("node7.cdn.test", "127.0.0.20", "fd00::20")
    resolver = _resolver(dns_server)
    for tcp in (False, True):
        answer = resolver.resolve("www.example.test", "A", tcp=tcp)
        assert _addresses(answer) == ["127.0.0.20"]
        assert answer.canonical_name.to_text() == "node7.cdn.test."
        cnames = [rrset for rrset in answer.response.answer if rrset.rdtype == dns.rdatatype.CNAME]
        assert len(cnames) == 2
    assert _addresses(resolver.resolve("www.example.test", "AAAA")) == ["fd00::20"]
    # one query per lookup: the server followed the chain itself
    assert [q for q in dns_server.queries if q[1] == "A"] == [("www.example.test", "A")] * 2

    dns_server.cname("dangling.test", "nowhere.test")
    with pytest.raises(dns.resolver.NXDOMAIN):
        resolver.resolve("dangling.test", "A")
    dns_server.cname("loop1.test", "loop2.test")
    dns_server.cname("loop2.test", "loop1.test")
    with pytest.raises(dns.resolver.NoNameservers):
        resolver.resolve("loop1.test", "A")


def test_dns_rebinding_cycles_per_query_type(dns_server: ScriptedDNS) -> None:
    dns_server.rebinding("rebind.test", [["127.0.0.10", "::10"], ["127.0.0.99", "::99"]])
    resolver = _resolver(dns_server)
    seen = [_addresses(resolver.resolve("rebind.test", "A", tcp=i % 2 == 1)) for i in range(3)]
    assert seen == [["127.0.0.10"], ["127.0.0.99"], ["127.0.0.10"]]
    assert _addresses(resolver.resolve("rebind.test", "AAAA")) == ["::10"]  # own counter
    answer = resolver.resolve("rebind.test", "A")
    assert answer.rrset is not None and answer.rrset.ttl == 0


def test_dns_truncates_big_udp_answers_and_survives_garbage(dns_server: ScriptedDNS) -> None:
    many = [f"127.0.1.{i}" for i in range(1, 101)]
    dns_server.add("many.test", *many)
    query = dns.message.make_query("many.test", "A", use_edns=False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(b"\x00garbage", dns_server.address)
        sock.sendto(query.to_wire(), dns_server.address)
        reply = dns.message.from_wire(sock.recv(65535))
    assert reply.flags & dns.flags.TC and not reply.answer
    # the stub resolver retries over TCP and gets all of them
    assert len(_resolver(dns_server).resolve("many.test", "A")) == 100
    assert {q.transport for q in dns_server.query_log} == {"udp", "tcp"}


# -------------------------------------------------------------------------------------------- HTTPS
def test_https_http11_keepalive_and_routes(upstream: HttpsUpstream, ca: trustme.CA) -> None:
    upstream.clear()
    conn = _https(ca, "127.0.1.10", "api.example.test")
    try:
        conn.request("GET", "/x?a=1&b=2", headers={"X-Test": "yes"})
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        assert resp.status == 200 and resp.getheader("Content-Type") == "application/json"
        assert resp.getheader("X-Upstream") == "up1"
        assert doc["server"] == "up1" and doc["method"] == "GET"
        assert doc["path"] == "/x?a=1&b=2" and doc["query"] == "a=1&b=2"
        assert doc["headers"]["x-test"] == "yes" and doc["authority"] == "api.example.test"
        assert doc["http_version"] == "1.1" and doc["sni"] == "api.example.test"

        conn.request("POST", "/submit", body=b"hello world", headers={"Content-Type": "text/plain"})
        assert json.loads(conn.getresponse().read())["body_len"] == 11

        conn.request("GET", "/status/418")
        resp = conn.getresponse()
        assert resp.status == 418 and resp.read() == b"status 418\n"

        conn.request("GET", "/redirect?to=https%3A%2F%2Felsewhere.test%2Fy")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 302 and resp.getheader("Location") == "https://elsewhere.test/y"

        conn.request("GET", "/bytes/200000")
        resp = conn.getresponse()
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert resp.read() == expected_bytes(200000)
    finally:
        conn.close()
    assert upstream.connection_count == 1
    reqs = upstream.requests
    assert [r["method"] for r in reqs] == ["GET", "POST", "GET", "GET", "GET"]
    assert reqs[1]["body"] == b"hello world" and reqs[1]["http_version"] == "1.1"
    assert ("X-Test", "yes") in reqs[0]["headers"] and reqs[0]["sni"] == "api.example.test"


def test_https_http2_with_curl(upstream: HttpsUpstream, ca_pem: Path, tmp_path: Path) -> None:
    upstream.clear()
    resolve = ["--resolve", "api.example.test:443:127.0.1.10", "--cacert", str(ca_pem)]
    out = subprocess.run(
        ["curl", "-sS", "--http2", *resolve, "https://api.example.test/x?y=1"],
        capture_output=True,
        timeout=10,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["http_version"] == "2" and doc["path"] == "/x?y=1" and doc["sni"] == "api.example.test"
    assert doc["authority"] == "api.example.test" and doc["server"] == "up1"

    body = tmp_path / "body"
    subprocess.run(
        ["curl", "-sS", "--http2", *resolve, "-o", str(body), "https://api.example.test/bytes/300000"],
        timeout=10,
        check=True,
    )
    assert body.read_bytes() == expected_bytes(300000)  # more than the default 64 KiB window
    assert [r["http_version"] for r in upstream.requests] == ["2", "2"]


def test_https_wrong_name_and_tcp_only(ca: trustme.CA, upstream: HttpsUpstream) -> None:
    with HttpsUpstream(ip="127.0.1.12", ca=ca, hostnames=("other.test",), name="wrong") as wrong:
        with pytest.raises(ssl.SSLCertVerificationError):
            _https(ca, "127.0.1.12", "api.example.test")
        assert wrong.requests == []
    with TcpOnly("127.0.1.13", 443) as tcp_only:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            _https(ca, "127.0.1.13", "api.example.test")
        assert tcp_only.accepts == 1
    # a client speaking plaintext garbage does not hurt the real upstream
    with socket.create_connection(upstream.address, timeout=2) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
        raw.recv(100)
    conn = _https(ca, "127.0.1.10", "api.example.test")
    conn.request("GET", "/after-garbage")
    assert conn.getresponse().status == 200
    conn.close()


# ------------------------------------------------------------------------------------------- canary
def test_canary_records_connects_and_datagrams() -> None:
    with Canary([("127.0.1.99", 443), ("127.0.1.99", 80)], udp_addresses=[("127.0.1.99", 53)]) as canary:
        canary.assert_untouched()
        socket.create_connection(("127.0.1.99", 443), timeout=2).close()
        with pytest.raises(AssertionError, match=r"tcp 127\.0\.1\.99:443 from 127\.0\.0\.1:"):
            canary.assert_untouched()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"ping", ("127.0.1.99", 53))
        hits = canary.hits
        assert [(h.proto, h.address) for h in hits] == [
            ("tcp", ("127.0.1.99", 443)),
            ("udp", ("127.0.1.99", 53)),
        ]
        assert hits[1].data == b"ping"
        canary.clear()
        canary.assert_untouched()
