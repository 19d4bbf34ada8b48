"""egressd's own resolver against a scripted DNS server on loopback (run inside the tests' network namespace).

Answers, CNAME chains, failures, TTL clamping with an injected clock, the cache, and rebinding.
"""

import asyncio
import ipaddress
import time
from collections.abc import Iterator

import pytest

from egressd.config import parse_hostport
from egressd.dns import DnsFailure, Resolution, Resolver
from tests.support.dns_server import ScriptedDNS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedDNS]:
    with ScriptedDNS() as dns_server:
        yield dns_server


@pytest.fixture
def dns(server: ScriptedDNS) -> ScriptedDNS:
    server.clear()
    server.set_default("nxdomain")
    return server


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_resolver(
    dns: ScriptedDNS, clock: Clock, *, timeout: float = 0.3, min_ttl: int = 5, max_ttl: int = 300
) -> Resolver:
    return Resolver([parse_hostport(dns.server_spec, 53)], timeout, min_ttl, max_ttl, clock=clock)


def resolve(resolver: Resolver, host: str) -> Resolution:
    return asyncio.run(resolver.resolve(host))


def failure(resolver: Resolver, host: str) -> DnsFailure:
    with pytest.raises(DnsFailure) as info:
        resolve(resolver, host)
    return info.value


def ips(*texts: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]:
    return tuple(ipaddress.ip_address(text) for text in texts)


# --- answers ---------------------------------------------------------------------------------------------


def test_a_and_aaaa(dns: ScriptedDNS, clock: Clock) -> None:
    dns.add("api.example.test", "::1", "127.0.0.10", "2001:db8::5", "127.0.0.11")
    result = resolve(make_resolver(dns, clock), "api.example.test")
    assert result.cached is False
    # IPv4 first (the first address is the one connected to); within a record set the order is the server's.
    assert set(result.addresses[:2]) == set(ips("127.0.0.10", "127.0.0.11"))
    assert set(result.addresses[2:]) == set(ips("::1", "2001:db8::5"))
    assert dns.queried("api.example.test", "A")
    assert dns.queried("api.example.test", "AAAA")


def test_only_a(dns: ScriptedDNS, clock: Clock) -> None:
    dns.add("v4.example.test", "127.0.0.10")
    assert resolve(make_resolver(dns, clock), "v4.example.test").addresses == ips("127.0.0.10")


def test_only_aaaa(dns: ScriptedDNS, clock: Clock) -> None:
    dns.add("v6.example.test", "::1")
    assert resolve(make_resolver(dns, clock), "v6.example.test").addresses == ips("::1")


def test_many_addresses_come_back_over_tcp(dns: ScriptedDNS, clock: Clock) -> None:
    many = [f"127.0.{i // 250}.{i % 250 + 1}" for i in range(60)]
    dns.add("many.example.test", *many)
    result = resolve(make_resolver(dns, clock), "many.example.test")
    assert set(result.addresses) == set(ips(*many))
    assert any(record.transport == "tcp" for record in dns.query_log)


def test_cname_chain_is_followed(dns: ScriptedDNS, clock: Clock) -> None:
    dns.cname("www.example.test", "edge.cdn.test")
    dns.cname("edge.cdn.test", "node7.cdn.test")
    dns.add("node7.cdn.test", "127.0.0.12", "::1")
    result = resolve(make_resolver(dns, clock), "www.example.test")
    assert result.addresses == ips("127.0.0.12", "::1")


def test_cname_into_forbidden_space_is_returned_for_the_gate_to_check(dns: ScriptedDNS, clock: Clock) -> None:
    dns.cname("innocent.example.test", "metadata.internal.test")
    dns.add("metadata.internal.test", "169.254.169.254")
    assert resolve(make_resolver(dns, clock), "innocent.example.test").addresses == ips("169.254.169.254")


def test_cname_to_a_name_without_addresses(dns: ScriptedDNS, clock: Clock) -> None:
    dns.cname("alias.example.test", "gone.example.test")
    dns.nxdomain("gone.example.test")
    assert failure(make_resolver(dns, clock), "alias.example.test").kind == "nxdomain"


def test_cname_loop_fails(dns: ScriptedDNS, clock: Clock) -> None:
    dns.cname("a.loop.test", "b.loop.test")
    dns.cname("b.loop.test", "a.loop.test")
    assert failure(make_resolver(dns, clock), "a.loop.test").kind == "servfail"


# --- failures ----------------------------------------------------------------------------------------------


def test_nxdomain(dns: ScriptedDNS, clock: Clock) -> None:
    dns.nxdomain("missing.example.test")
    error = failure(make_resolver(dns, clock), "missing.example.test")
    assert error.kind == "nxdomain"
    assert "missing.example.test" in str(error)
    assert "NXDOMAIN" in str(error)


def test_unknown_name_is_nxdomain(dns: ScriptedDNS, clock: Clock) -> None:
    assert failure(make_resolver(dns, clock), "unscripted.example.test").kind == "nxdomain"


def test_servfail(dns: ScriptedDNS, clock: Clock) -> None:
    dns.servfail("broken.example.test")
    error = failure(make_resolver(dns, clock), "broken.example.test")
    assert error.kind == "servfail"
    assert "broken.example.test" in str(error)


def test_refused_is_a_failure(dns: ScriptedDNS, clock: Clock) -> None:
    dns.set_default("refused")
    assert failure(make_resolver(dns, clock), "refused.example.test").kind == "servfail"


def test_no_records_at_all(dns: ScriptedDNS, clock: Clock) -> None:
    dns.set_default("noerror")
    error = failure(make_resolver(dns, clock), "empty.example.test")
    assert error.kind == "no_answer"


def test_timeout(dns: ScriptedDNS, clock: Clock) -> None:
    dns.timeout("slow.example.test")
    resolver = make_resolver(dns, clock, timeout=0.3)
    started = time.monotonic()
    error = failure(resolver, "slow.example.test")
    elapsed = time.monotonic() - started
    assert error.kind == "timeout"
    assert "timed out" in str(error)
    assert 0.25 <= elapsed < 2.0
    assert dns.queried("slow.example.test")


def test_failures_are_not_cached(dns: ScriptedDNS, clock: Clock) -> None:
    dns.nxdomain("later.example.test")
    resolver = make_resolver(dns, clock)
    assert failure(resolver, "later.example.test").kind == "nxdomain"
    dns.add("later.example.test", "127.0.0.10")
    assert resolve(resolver, "later.example.test").addresses == ips("127.0.0.10")


# --- TTLs and the cache -----------------------------------------------------------------------------------


def test_answer_is_cached_within_its_ttl(dns: ScriptedDNS, clock: Clock) -> None:
    dns.add("cached.example.test", "127.0.0.10", ttl=60)
    resolver = make_resolver(dns, clock)
    first = resolve(resolver, "cached.example.test")
    assert first.cached is False
    asked = dns.query_count("cached.example.test")
    dns.add("cached.example.test", "127.0.0.99", ttl=60)  # the server changes its mind
    clock.now += 59.9
    second = resolve(resolver, "cached.example.test")
    assert second.cached is True
    assert second.addresses == first.addresses
    assert dns.query_count("cached.example.test") == asked  # no query while cached
    clock.now += 0.1
    third = resolve(resolver, "cached.example.test")
    assert third.cached is False
    assert third.addresses == ips("127.0.0.99")
    assert dns.query_count("cached.example.test") > asked


def test_cache_is_per_name(dns: ScriptedDNS, clock: Clock) -> None:
    dns.add("one.example.test", "127.0.0.10")
    dns.add("two.example.test", "127.0.0.11")
    resolver = make_resolver(dns, clock)
    assert resolve(resolver, "one.example.test").addresses == ips("127.0.0.10")
    two = resolve(resolver, "two.example.test")
    assert two.cached is False
    assert two.addresses == ips("127.0.0.11")


@pytest.mark.parametrize(
    ("server_ttl", "min_ttl", "max_ttl", "kept"),
    [
        (60, 5, 300, 60),  # within bounds: the server's TTL
        (1, 5, 300, 5),  # raised to min_ttl
        (0, 5, 300, 5),
        (86400, 5, 300, 300),  # lowered to max_ttl
        (100, 0, 30, 30),
        (10, 10, 10, 10),
    ],
)
def test_ttl_is_clamped(
    dns: ScriptedDNS, clock: Clock, server_ttl: int, min_ttl: int, max_ttl: int, kept: int
) -> None:
    dns.add("ttl.example.test", "127.0.0.10", "::1", ttl=server_ttl)
    resolver = make_resolver(dns, clock, min_ttl=min_ttl, max_ttl=max_ttl)
    start = clock.now
    assert resolve(resolver, "ttl.example.test").cached is False
    clock.now = start + kept - 0.01
    assert resolve(resolver, "ttl.example.test").cached is True
    clock.now = start + kept
    assert resolve(resolver, "ttl.example.test").cached is False


def test_lowest_ttl_in_a_cname_chain_counts(dns: ScriptedDNS, clock: Clock) -> None:
    dns.cname("short.example.test", "long.example.test", ttl=20)
    dns.add("long.example.test", "127.0.0.10", ttl=3600)
    resolver = make_resolver(dns, clock)
    start = clock.now
    resolve(resolver, "short.example.test")
    clock.now = start + 19.99
    assert resolve(resolver, "short.example.test").cached is True
    clock.now = start + 20
    assert resolve(resolver, "short.example.test").cached is False


def test_rebinding_with_ttl_zero_gets_fresh_answers(dns: ScriptedDNS, clock: Clock) -> None:
    dns.rebinding("rebind.example.test", [["127.0.0.10"], ["127.0.0.99"]], ttl=0)
    resolver = make_resolver(dns, clock, min_ttl=0)
    seen = [resolve(resolver, "rebind.example.test") for _ in range(4)]
    assert [result.cached for result in seen] == [False] * 4
    assert [result.addresses for result in seen] == [
        ips("127.0.0.10"),
        ips("127.0.0.99"),
        ips("127.0.0.10"),
        ips("127.0.0.99"),
    ]
    assert dns.query_count("rebind.example.test", "A") == 4


def test_rebinding_within_min_ttl_sees_the_checked_answer(dns: ScriptedDNS, clock: Clock) -> None:
    dns.rebinding("rebind.example.test", [["127.0.0.10"], ["127.0.0.99"]], ttl=0)
    resolver = make_resolver(dns, clock, min_ttl=5)
    first = resolve(resolver, "rebind.example.test")
    clock.now += 4
    second = resolve(resolver, "rebind.example.test")
    assert second.cached is True
    assert second.addresses == first.addresses == ips("127.0.0.10")
    clock.now += 1
    third = resolve(resolver, "rebind.example.test")
    assert third.cached is False
    assert third.addresses == ips("127.0.0.99")


def test_mixed_answers_are_all_returned(dns: ScriptedDNS, clock: Clock) -> None:
    dns.add("mixed.example.test", "93.184.216.34", "127.0.0.1", "2606:2800:220:1::1", "::1")
    result = resolve(make_resolver(dns, clock), "mixed.example.test")
    assert set(result.addresses) == set(ips("93.184.216.34", "127.0.0.1", "2606:2800:220:1::1", "::1"))
