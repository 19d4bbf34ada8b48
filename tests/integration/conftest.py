"""Shared fixtures: a scripted DNS server, HTTPS upstreams, a canary, and one real egressd daemon.

Names the DNS server knows (allow_cidrs opens only 127.0.0.8/29, where the upstreams live):
api/www.example.test → the echo upstream 127.0.0.10; ws.example.test → a WebSocket upstream 127.0.0.11;
badcert.example.test → 127.0.0.12 (certificate for another name); closed.example.test → 127.0.0.13
(nothing listens); blackhole.example.test → 127.0.0.14 (SYNs dropped); canary.example.test → the canary
127.0.0.99 (forbidden); and others scripted per test.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.canary import Canary
from tests.support.dns_server import ScriptedDNS
from tests.support.egressd_process import Egressd, curl_path
from tests.support.netns import require_isolated_netns
from tests.support.upstream import HttpsUpstream, make_test_ca, write_ca_pem
from tests.support.websocket import WebSocketUpstream

TEST_POLICY = """
name = "test"
version = 1
description = "integration tests"

[[allow]]
host = "api.example.test"
reason = "the echo upstream, anything goes"

[[allow]]
host = "www.example.test"
reason = "narrow rules"
methods = ["GET"]
paths = ["/docs/**", "/item/*/view"]

[[allow]]
host = "ws.example.test"
reason = "websockets allowed"
websocket = true

[[allow]]
host = "badcert.example.test"
reason = "upstream with a certificate for another name"

[[allow]]
host = "closed.example.test"
reason = "nothing listens there"

[[allow]]
host = "canary.example.test"
reason = "resolves into forbidden space"

[[allow]]
host = "meta.example.test"
reason = "resolves to the metadata address"

[[allow]]
host = "mixed.example.test"
reason = "one good, one forbidden address"

[[allow]]
host = "chain.example.test"
reason = "CNAME chain into forbidden space"

[[allow]]
host = "rebind.example.test"
reason = "rebinding"

[[allow]]
host = "blackhole.example.test"
reason = "SYNs go unanswered"

[[allow]]
host = "nx.example.test"
reason = "does not exist"

[[allow]]
host = "dnstimeout.example.test"
reason = "DNS never answers"
"""


@pytest.fixture(scope="session", autouse=True)
def _isolated() -> None:
    require_isolated_netns()
    curl_path()  # a missing tool fails the run; it never turns into a skip


@pytest.fixture(scope="session")
def test_ca() -> trustme.CA:
    return make_test_ca()


@pytest.fixture(scope="session")
def test_ca_pem(test_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ca_pem(test_ca, tmp_path_factory.mktemp("testca") / "ca.pem")


@pytest.fixture(scope="session")
def dns() -> Iterator[ScriptedDNS]:
    with ScriptedDNS(host="127.0.0.53") as server:
        script_names(server)
        yield server


def script_names(server: ScriptedDNS) -> None:
    for name in ("api.example.test", "www.example.test", "other.example.test"):
        server.add(name, "127.0.0.10")
    server.add("ws.example.test", "127.0.0.11")
    server.add("badcert.example.test", "127.0.0.12")
    server.add("closed.example.test", "127.0.0.13")
    server.add("blackhole.example.test", "127.0.0.14")
    server.add("canary.example.test", "127.0.0.99")
    server.add("meta.example.test", "169.254.169.254")
    server.add("mixed.example.test", "127.0.0.10", "127.0.0.99")
    server.cname("chain.example.test", "hop1.example.test")
    server.cname("hop1.example.test", "hop2.example.test")
    server.add("hop2.example.test", "127.0.0.99")
    server.nxdomain("nx.example.test")
    server.timeout("dnstimeout.example.test")


@pytest.fixture(scope="session")
def upstream(test_ca: trustme.CA) -> Iterator[HttpsUpstream]:
    names = ("api.example.test", "www.example.test", "other.example.test")
    with HttpsUpstream(ip="127.0.0.10", ca=test_ca, hostnames=names, name="up1") as server:
        yield server


@pytest.fixture(scope="session")
def websocket_upstream(test_ca: trustme.CA) -> Iterator[WebSocketUpstream]:
    with WebSocketUpstream("127.0.0.11", test_ca, ("ws.example.test",)) as server:
        yield server


@pytest.fixture(scope="session")
def wrong_cert_upstream(test_ca: trustme.CA) -> Iterator[HttpsUpstream]:
    with HttpsUpstream(ip="127.0.0.12", ca=test_ca, hostnames=("someone-else.test",), name="wrong") as server:
        yield server


@pytest.fixture(scope="session")
def canary() -> Iterator[Canary]:
    addresses = [("127.0.0.99", 443), ("127.0.0.99", 80), ("127.0.0.1", 443), ("127.0.0.1", 80)]
    with Canary(addresses) as trap:
        yield trap


@pytest.fixture(scope="session")
def egressd(tmp_path_factory: pytest.TempPathFactory, dns: ScriptedDNS, test_ca_pem: Path,
            upstream: HttpsUpstream, wrong_cert_upstream: HttpsUpstream, canary: Canary) -> Iterator[Egressd]:
    daemon = Egressd(tmp_path_factory.mktemp("egressd"), dns.server_spec, test_ca_pem)
    daemon.write_policy("test-v1.toml", TEST_POLICY)
    daemon.start()
    yield daemon
    daemon.stop()
    canary.assert_untouched()


@pytest.fixture(scope="session")
def run(egressd: Egressd) -> dict:
    """A run of the test policy shared by read-only tests."""
    return egressd.mint("test", "--label", "shared")


@pytest.fixture
def fresh_egressd(tmp_path: Path, dns: ScriptedDNS, test_ca_pem: Path, upstream: HttpsUpstream,
                  canary: Canary) -> Iterator[Egressd]:
    """A daemon of a test's own (on port 3129, metrics on 9465) for tests that restart, reload, revoke or count."""
    daemon = Egressd(tmp_path, dns.server_spec, test_ca_pem, listen="127.0.0.1:3129", metrics="127.0.0.1:9465")
    daemon.write_policy("test-v1.toml", TEST_POLICY)
    yield daemon
    daemon.stop()
