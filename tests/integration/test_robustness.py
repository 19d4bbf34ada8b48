"""Bad input never takes the daemon down: after each abuse, a good request still works."""

import os
import socket
import ssl

import pytest

from tests.support.egressd_process import Egressd, basic, read_response, rss_kib

HUGE = b"X-Big: " + b"a" * 300_000 + b"\r\n"


def send_raw(egressd: Egressd, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", egressd.proxy_port), timeout=5) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            return sock.recv(65536)
        except OSError:
            return b""


@pytest.mark.parametrize("payload", [
    os.urandom(4096),
    b"\x00\xff\x16\x03\x01garbage\r\n\r\n",
    b"CONNECT\r\n\r\n",
    b"CONNECT api.example.test HTTP/1.1\r\n\r\n",
    b"CONNECT :443 HTTP/1.1\r\n\r\n",
    b"CONNECT api.example.test:99999 HTTP/1.1\r\n\r\n",
    b"CONNECT api.example.test:443 HTTP/9.9\r\n\r\n",
    b"CONNECT api.example.test:443 HTTP/1.1\r\n" + HUGE + b"\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"\r\n" * 10000,
])
def test_garbage_to_the_proxy_port(egressd: Egressd, run: dict, payload: bytes) -> None:
    send_raw(egressd, payload)
    assert egressd.alive()
    assert egressd.curl("https://api.example.test/after-garbage", run["token"]).status == 200


def test_garbage_and_huge_headers_inside_a_tunnel(egressd: Egressd, run: dict) -> None:
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        sock.sendall(b"\x16\x03\x01\x00\x05hello" + os.urandom(2000))  # a TLS record that is not a ClientHello
        sock.settimeout(3)
        try:
            sock.recv(65536)
        except OSError:
            pass
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        tls = egressd.tls_in_tunnel(sock, "api.example.test")
        try:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: api.example.test\r\n" + HUGE + b"\r\n")
            tls.recv(65536)
        except (OSError, ssl.SSLError):
            pass
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        sock.sendall(b"NOT HTTP AND NOT TLS\r\n\r\n" + os.urandom(512))
        try:
            sock.recv(65536)
        except OSError:
            pass
    assert egressd.alive()
    assert egressd.curl("https://api.example.test/after-tunnel-garbage", run["token"]).status == 200


def test_plaintext_inside_a_tunnel_is_refused(egressd: Egressd, run: dict, upstream) -> None:
    """Plain HTTP through a CONNECT to 443 never reaches the upstream: there is no TLS, so no SNI."""
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        sock.sendall(b"GET /plaintext HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
        sock.settimeout(5)
        answer = sock.recv(65536)
    assert b"sni_mismatch" in answer
    assert not any(r["path"] == "/plaintext" for r in upstream.requests)


def test_bad_tokens_of_every_shape(egressd: Egressd, run: dict) -> None:
    for header in ("Basic", "Basic ====", "Bearer", "Bearer " + "x" * 5000, "Digest abc", basic("short"),
                   "Basic " + "A" * 100_000):
        sock, status, _, _ = egressd.connect("api.example.test:443", header)
        sock.close()
        assert status in (400, 407) and egressd.alive()
    assert egressd.curl("https://api.example.test/after-bad-tokens", run["token"]).status == 200


def test_many_refused_connects_in_a_row(egressd: Egressd, run: dict) -> None:
    for index in range(200):
        sock, status, _, _ = egressd.connect(f"host-{index}.refused.test:443", basic(run["token"]))
        sock.close()
        assert status == 403
    assert egressd.curl("https://api.example.test/after-many", run["token"]).status == 200


def test_a_refused_request_body_is_discarded_not_buffered(egressd: Egressd, run: dict, upstream) -> None:
    """64 MiB sent with a refused POST: the refusal comes after the body, and egressd's memory stays flat."""
    assert egressd.process is not None
    before = rss_kib(egressd.process.pid)
    size, chunk = 64 * 1024 * 1024, b"z" * (1024 * 1024)
    with egressd.tunnel("www.example.test", run["token"]) as sock:
        tls = egressd.tls_in_tunnel(sock, "www.example.test")
        tls.sendall(b"POST /docs/upload HTTP/1.1\r\nHost: www.example.test\r\n"
                    + f"Content-Length: {size}\r\n\r\n".encode())
        for _ in range(size // len(chunk)):
            tls.sendall(chunk)
        status, headers, _ = read_response(tls, timeout=30)
    assert (status, headers["x-egressd-reason"]) == (403, "method_not_allowed")
    grown_mib = (rss_kib(egressd.process.pid) - before) / 1024
    assert grown_mib < 32, f"egressd grew by {grown_mib:.0f} MiB while discarding a refused body"
    assert not any(r["path"] == "/docs/upload" for r in upstream.requests)
