"""Every reason code produced end to end through the real daemon, seen in the response and the audit log."""

import base64
import contextlib
import json
import socket
import time
from pathlib import Path

import pytest

from tests.support.canary import Canary
from tests.support.dns_server import ScriptedDNS
from tests.support.egressd_process import Egressd, basic, read_response
from tests.support.upstream import HttpsUpstream
from tests.support.websocket import WebSocketUpstream, websocket_exchange


def assert_refusal(status: int, headers: dict[str, str], body: bytes | str, reason: str, expected_status: int,
                   run_id: str | None = None) -> dict:
    assert status == expected_status, (status, body)
    assert headers["content-type"] == "application/json"
    assert headers["x-egressd-reason"] == reason
    data = json.loads(body)
    assert data["error"] == "egress_blocked"
    assert data["reason"] == reason
    assert isinstance(data["detail"], str) and data["detail"]
    assert set(data) == {"error", "reason", "detail", "host", "run_id"}
    assert data["run_id"] == run_id
    return data


def connect_refusal(egressd: Egressd, target: str, authorization: str | None, reason: str, status: int = 403,
                    run_id: str | None = None) -> dict:
    sock, got_status, headers, body = egressd.connect(target, authorization)
    sock.close()
    data = assert_refusal(got_status, headers, body, reason, status, run_id)
    line = egressd.wait_audit(lambda a: a["event"] == "connect" and a["reason"] == reason
                              and a["run_id"] == run_id)
    assert line["decision"] == "deny"
    return data


# --- at the CONNECT ------------------------------------------------------------------------------------

def test_auth_required(egressd: Egressd) -> None:
    sock, status, headers, body = egressd.connect("api.example.test:443", None)
    sock.close()
    assert_refusal(status, headers, body, "auth_required", 407)
    assert headers["proxy-authenticate"] == 'Basic realm="egressd"'
    egressd.wait_audit(lambda a: a["reason"] == "auth_required")


def test_407_keeps_the_connection_for_a_retry_with_credentials(egressd: Egressd, run: dict) -> None:
    """libcurl and git probe without credentials first, then retry on the same connection."""
    sock, status, _, _ = egressd.connect("api.example.test:443", None)
    with sock:
        assert status == 407
        sock.sendall(f"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n"
                     f"Proxy-Authorization: {basic(run['token'])}\r\n\r\n".encode())
        status, _, _ = read_response(sock)
        assert status == 200


def test_token_invalid(egressd: Egressd) -> None:
    connect_refusal(egressd, "api.example.test:443", basic("A" * 43), "token_invalid", 407)
    connect_refusal(egressd, "api.example.test:443", "Basic %%%garbage", "token_invalid", 407)


def test_bearer_token_is_accepted(egressd: Egressd, run: dict) -> None:
    sock, status, _, _ = egressd.connect("api.example.test:443", f"Bearer {run['token']}")
    sock.close()
    assert status == 200


def test_token_expired(egressd: Egressd) -> None:
    short = egressd.mint("test", "--ttl", "1")
    time.sleep(1.2)
    connect_refusal(egressd, "api.example.test:443", basic(short["token"]), "token_expired", 407)
    egressd.wait_audit(lambda a: a["event"] == "run" and a.get("action") == "expire"
                       and a["run_id"] == short["run_id"])


def test_token_revoked(egressd: Egressd) -> None:
    minted = egressd.mint("test")
    assert egressd.cli("token", "revoke", minted["run_id"]).returncode == 0
    connect_refusal(egressd, "api.example.test:443", basic(minted["token"]), "token_revoked", 407)


def test_https_only(egressd: Egressd, run: dict) -> None:
    result = egressd.curl("http://api.example.test/", run["token"])
    assert_refusal(result.status, result.headers, result.body, "https_only", 403, run["run_id"])
    egressd.wait_audit(lambda a: a["reason"] == "https_only" and a["run_id"] == run["run_id"])


@pytest.mark.parametrize("target", ["127.0.0.10:443", "[::1]:443", "2130706433:443", "0x7f000001:443",
                                    "0177.0.0.1:443", "127.1:443", "127.0.1:443", "[::ffff:127.0.0.10]:443"])
def test_ip_literal(egressd: Egressd, run: dict, target: str) -> None:
    connect_refusal(egressd, target, basic(run["token"]), "ip_literal", 403, run["run_id"])


@pytest.mark.parametrize("target", ["under_score.example.test:443", "nodots:443", "-bad-.example.test:443"])
def test_invalid_host(egressd: Egressd, run: dict, target: str) -> None:
    connect_refusal(egressd, target, basic(run["token"]), "invalid_host", 403, run["run_id"])


def test_port_not_allowed(egressd: Egressd, run: dict) -> None:
    connect_refusal(egressd, "api.example.test:8443", basic(run["token"]), "port_not_allowed", 403, run["run_id"])


def test_host_not_allowed_sends_no_dns_query(egressd: Egressd, run: dict, dns: ScriptedDNS) -> None:
    data = connect_refusal(egressd, "other.example.test:443", basic(run["token"]), "host_not_allowed", 403,
                           run["run_id"])
    assert data["host"] == "other.example.test"
    assert not dns.queried("other.example.test")


def test_dns_failure(egressd: Egressd, run: dict) -> None:
    connect_refusal(egressd, "nx.example.test:443", basic(run["token"]), "dns_failure", 502, run["run_id"])
    connect_refusal(egressd, "dnstimeout.example.test:443", basic(run["token"]), "dns_failure", 502,
                    run["run_id"])


@pytest.mark.parametrize("host", ["canary.example.test", "meta.example.test", "mixed.example.test",
                                  "chain.example.test"])
def test_forbidden_address(egressd: Egressd, run: dict, canary: Canary, host: str) -> None:
    connect_refusal(egressd, f"{host}:443", basic(run["token"]), "forbidden_address", 403, run["run_id"])
    canary.assert_untouched()


def test_rebinding_never_reaches_forbidden_space(egressd: Egressd, run: dict, dns: ScriptedDNS,
                                                 canary: Canary, upstream: HttpsUpstream) -> None:
    dns.rebinding("rebind.example.test", [["127.0.0.10"], ["127.0.0.99"]], ttl=0)
    outcomes = []
    for _ in range(6):
        result = egressd.curl("https://rebind.example.test/", run["token"])
        outcomes.append(result.headers.get("x-egressd-reason") or result.status)
    assert "forbidden_address" in outcomes
    canary.assert_untouched()


def test_upstream_connect_failure(egressd: Egressd, run: dict) -> None:
    connect_refusal(egressd, "closed.example.test:443", basic(run["token"]), "upstream_error", 502,
                    run["run_id"])


def test_upstream_connect_timeout(egressd: Egressd, run: dict) -> None:
    """An upstream that never answers the SYN: refused after upstream.connect_timeout (3 s in these tests)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.14", 443))
        listener.listen(0)
        # Fill the accept queue so the kernel drops further SYNs: the connect neither succeeds nor fails.
        fillers = [socket.socket() for _ in range(4)]
        for filler in fillers:
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.14", 443))
        try:
            started = time.monotonic()
            sock, status, headers, body = egressd.connect("blackhole.example.test:443", basic(run["token"]),
                                                          timeout=15)
            sock.close()
            data = assert_refusal(status, headers, body, "upstream_error", 502, run["run_id"])
            assert "no answer within 3 s" in data["detail"]
            assert 2.5 < time.monotonic() - started < 10
        finally:
            for filler in fillers:
                filler.close()


def test_upstream_certificate_for_another_name(egressd: Egressd, run: dict,
                                               wrong_cert_upstream: HttpsUpstream) -> None:
    result = egressd.curl("https://badcert.example.test/", run["token"])
    assert_refusal(result.status, result.headers, result.body, "upstream_error", 502, run["run_id"])
    egressd.wait_audit(lambda a: a["event"] == "request" and a["reason"] == "upstream_error")
    assert wrong_cert_upstream.requests == []


# --- inside the tunnel -------------------------------------------------------------------------------------

def test_sni_mismatch(egressd: Egressd, run: dict, upstream: HttpsUpstream) -> None:
    for sni in ("other.example.test", None):
        with egressd.tunnel("api.example.test", run["token"]) as sock:
            tls = egressd.tls_in_tunnel(sock, sni)
            tls.sendall(b"GET /sni HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
            status, headers, body = read_response(tls)
            assert_refusal(status, headers, body, "sni_mismatch", 403, run["run_id"])
    egressd.wait_audit(lambda a: a["event"] == "request" and a["reason"] == "sni_mismatch")
    assert not any(r["path"] == "/sni" for r in upstream.requests)


@pytest.mark.parametrize("args", [["-H", "Host: other.example.test"], ["-H", "Host: api.example.test:8443"]])
def test_host_mismatch(egressd: Egressd, run: dict, args: list[str]) -> None:
    result = egressd.curl("https://api.example.test/", run["token"], "--http1.1", *args)
    assert_refusal(result.status, result.headers, result.body, "host_mismatch", 403, run["run_id"])
    egressd.wait_audit(lambda a: a["event"] == "request" and a["reason"] == "host_mismatch")


def test_absolute_form_naming_another_host(egressd: Egressd, run: dict) -> None:
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        tls = egressd.tls_in_tunnel(sock, "api.example.test")
        tls.sendall(b"GET https://other.example.test/ HTTP/1.1\r\nHost: other.example.test\r\n\r\n")
        status, headers, body = read_response(tls)
        assert_refusal(status, headers, body, "host_mismatch", 403, run["run_id"])


def test_host_mismatch_over_http2(egressd: Egressd, run: dict) -> None:
    result = egressd.curl("https://api.example.test/", run["token"], "--http2", "-H", "Host: other.example.test")
    assert_refusal(result.status, result.headers, result.body, "host_mismatch", 403, run["run_id"])


def test_method_not_allowed(egressd: Egressd, run: dict) -> None:
    result = egressd.curl("https://www.example.test/docs/a", run["token"], "-X", "POST")
    assert_refusal(result.status, result.headers, result.body, "method_not_allowed", 403, run["run_id"])
    line = egressd.wait_audit(lambda a: a["reason"] == "method_not_allowed")
    assert line["method"] == "POST" and line["path"] == "/docs/a" and line["status"] == 403


def test_path_not_allowed(egressd: Egressd, run: dict) -> None:
    result = egressd.curl("https://www.example.test/admin?secret=1", run["token"])
    assert_refusal(result.status, result.headers, result.body, "path_not_allowed", 403, run["run_id"])
    line = egressd.wait_audit(lambda a: a["reason"] == "path_not_allowed")
    assert line["path"] == "/admin"


def test_allowed_paths(egressd: Egressd, run: dict) -> None:
    for path in ("/docs", "/docs/a/b/c", "/item/42/view"):
        assert egressd.curl(f"https://www.example.test{path}", run["token"]).status == 200
    assert egressd.curl("https://www.example.test/item/4/2/view", run["token"]).status == 403


@pytest.mark.parametrize("path", ["/docs/../admin", "/docs/%2e%2e/admin", "/docs/%2E%2e/admin", "/docs/./a"])
def test_invalid_path(egressd: Egressd, run: dict, path: str) -> None:
    result = egressd.curl(f"https://www.example.test{path}", run["token"], "--path-as-is")
    assert_refusal(result.status, result.headers, result.body, "invalid_path", 403, run["run_id"])
    egressd.wait_audit(lambda a: a["reason"] == "invalid_path")


def test_h2c_upgrade_is_a_bad_request(egressd: Egressd, run: dict) -> None:
    result = egressd.curl("https://api.example.test/", run["token"], "--http1.1",
                          "-H", "Connection: Upgrade, HTTP2-Settings", "-H", "Upgrade: h2c",
                          "-H", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA")
    assert_refusal(result.status, result.headers, result.body, "bad_request", 400, run["run_id"])
    egressd.wait_audit(lambda a: a["reason"] == "bad_request")


def test_connect_inside_a_tunnel_is_a_bad_request(egressd: Egressd, run: dict) -> None:
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        tls = egressd.tls_in_tunnel(sock, "api.example.test")
        tls.sendall(b"CONNECT other.example.test:443 HTTP/1.1\r\nHost: other.example.test:443\r\n\r\n")
        status, headers, body = read_response(tls)
        # mitmproxy refuses this itself, before any hook: the answer has egressd's shape, the audit has the run.
        assert_refusal(status, headers, body, "bad_request", 400, None)
    egressd.wait_audit(lambda a: a["reason"] == "bad_request" and a["method"] == "CONNECT"
                       and a["run_id"] == run["run_id"])


@pytest.mark.parametrize("framing", [
    b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
    b"Content-Length: 3\r\nContent-Length: 4\r\n",
])
def test_ambiguous_framing_is_a_bad_request(egressd: Egressd, run: dict, upstream: HttpsUpstream,
                                             framing: bytes) -> None:
    with egressd.tunnel("api.example.test", run["token"]) as sock:
        tls = egressd.tls_in_tunnel(sock, "api.example.test")
        tls.sendall(b"POST /smuggle HTTP/1.1\r\nHost: api.example.test\r\n" + framing + b"\r\n0\r\n\r\n")
        status, headers, body = read_response(tls)
        assert_refusal(status, headers, body, "bad_request", 400, None)
    assert not any(r["path"] == "/smuggle" for r in upstream.requests)


def test_websocket_not_allowed(egressd: Egressd, run: dict) -> None:
    result = egressd.curl("https://api.example.test/socket", run["token"], "--http1.1",
                          "-H", "Connection: Upgrade", "-H", "Upgrade: websocket",
                          "-H", "Sec-WebSocket-Version: 13", "-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
    assert_refusal(result.status, result.headers, result.body, "websocket_not_allowed", 403, run["run_id"])
    egressd.wait_audit(lambda a: a["reason"] == "websocket_not_allowed")


def test_websocket_where_the_rule_allows_it(egressd: Egressd, run: dict,
                                            websocket_upstream: WebSocketUpstream) -> None:
    with egressd.tunnel("ws.example.test", run["token"]) as sock:
        tls = egressd.tls_in_tunnel(sock, "ws.example.test")
        status, received = websocket_exchange(tls, "ws.example.test", "/chat", [], ["hello"])
    assert status == 101
    assert received[1:] == ["echo:hello"]
    assert websocket_upstream.received[-1] == "hello"


def test_policy_gone(fresh_egressd: Egressd) -> None:
    """A run stays bound to its version; when that version's file is removed and reloaded, it is refused:
    at the CONNECT, and for the next request of a tunnel that was already open."""
    fresh_egressd.write_policy("gone-v1.toml", 'name = "gone"\nversion = 1\n[[allow]]\n'
                               'host = "api.example.test"\nreason = "short-lived"\n')
    fresh_egressd.start()
    minted = fresh_egressd.mint("gone")
    with fresh_egressd.tunnel("api.example.test", minted["token"]) as sock:
        tls = fresh_egressd.tls_in_tunnel(sock, "api.example.test")
        tls.sendall(b"GET /before HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
        assert read_response(tls)[0] == 200
        (fresh_egressd.policies / "gone-v1.toml").unlink()
        assert fresh_egressd.cli("policy", "reload").returncode == 0
        tls.sendall(b"GET /after HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
        status, headers, body = read_response(tls)
        assert_refusal(status, headers, body, "policy_gone", 403, minted["run_id"])
    connect_refusal(fresh_egressd, "api.example.test:443", basic(minted["token"]), "policy_gone", 403,
                    minted["run_id"])


def test_audit_lines_hold_no_token_query_or_header_value(egressd: Egressd, run: dict) -> None:
    egressd.curl("https://api.example.test/q?canary=QUERYCANARY", run["token"], "-H", "X-Secret: HEADERCANARY")
    egressd.wait_audit(lambda a: a["event"] == "request" and a["path"] == "/q")
    text = egressd.audit_path.read_text()
    assert run["token"] not in text
    assert "QUERYCANARY" not in text and "HEADERCANARY" not in text
    assert base64.b64encode(f"egressd:{run['token']}".encode()).decode() not in text


def test_every_reason_code_is_produced_end_to_end() -> None:
    """Each code is asserted in a response and the audit log here or, for secrets, in test_secrets.py."""
    from egressd.reasons import Reason

    here = Path(__file__)
    source = here.read_text() + (here.parent / "test_secrets.py").read_text()
    missing = [reason.value for reason in Reason if f'"{reason.value}"' not in source]
    assert missing == []


