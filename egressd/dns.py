"""DNS resolution done by egressd itself: A and AAAA with dnspython, CNAMEs followed, answers cached
within the configured TTL bounds. The gate connects only to addresses this returned and it checked."""

import asyncio
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.message
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_CNAME_HOPS = 8


class DnsFailure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # "nxdomain", "servfail", "timeout" or "no_answer"


@dataclass(frozen=True, slots=True)
class Resolution:
    addresses: tuple[IPAddress, ...]  # IPv4 first: the first is the one connected to
    cached: bool


class Resolver:
    def __init__(
        self,
        servers: list[tuple[str, int]],
        timeout: float,
        min_ttl: int,
        max_ttl: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolver = dns.asyncresolver.Resolver(configure=not servers)
        if servers:
            self._resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in servers]
        self._resolver.cache = None  # egressd keeps its own cache with its own TTL bounds
        self._timeout = timeout
        self._min_ttl, self._max_ttl = min_ttl, max_ttl
        self._clock = clock
        self._cache: dict[str, tuple[float, tuple[IPAddress, ...]]] = {}

    async def resolve(self, host: str) -> Resolution:
        """All A and AAAA addresses of a host name, or DnsFailure."""
        now = self._clock()
        hit = self._cache.get(host)
        if hit is not None and hit[0] > now:
            return Resolution(hit[1], cached=True)
        results = await asyncio.gather(
            self._query(host, dns.rdatatype.A), self._query(host, dns.rdatatype.AAAA), return_exceptions=True
        )
        addresses: list[IPAddress] = []
        ttls: list[int] = []
        failures: list[DnsFailure] = []
        for result in results:
            if isinstance(result, DnsFailure):
                failures.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                found, ttl = result
                addresses.extend(found)
                if found:
                    ttls.append(ttl)
        if not addresses:
            raise failures[0] if failures else DnsFailure("no_answer", f"{host} has no A or AAAA records")
        ttl = min(max(min(ttls), self._min_ttl), self._max_ttl)
        found_addresses = tuple(addresses)
        if ttl > 0:
            self._cache[host] = (now + ttl, found_addresses)
        if len(self._cache) > 10_000:
            self._evict(now)
        return Resolution(found_addresses, cached=False)

    def _evict(self, now: float) -> None:
        for name in [name for name, (expiry, _) in self._cache.items() if expiry <= now]:
            del self._cache[name]

    async def _query(self, host: str, rdtype: dns.rdatatype.RdataType) -> tuple[list[IPAddress], int]:
        name = dns.name.from_text(host)
        ttl = self._max_ttl
        for _ in range(MAX_CNAME_HOPS):
            try:
                answer = await self._resolver.resolve(
                    name, rdtype, lifetime=self._timeout, raise_on_no_answer=False, search=False
                )
            except dns.resolver.NXDOMAIN:
                raise DnsFailure("nxdomain", f"{host} does not exist (NXDOMAIN)") from None
            except dns.resolver.NoNameservers:
                raise DnsFailure("servfail", f"no DNS server could answer for {host} (SERVFAIL)") from None
            except dns.exception.Timeout:
                raise DnsFailure("timeout", f"DNS lookup of {host} timed out") from None
            except dns.exception.DNSException as err:
                raise DnsFailure("servfail", f"DNS lookup of {host} failed: {type(err).__name__}") from None
            ttl = min([ttl, *(rrset.ttl for rrset in answer.response.answer)])
            if answer.rrset is not None:
                return [ipaddress.ip_address(rdata.address) for rdata in answer.rrset], ttl
            if answer.canonical_name == name:
                return [], ttl
            # The server gave the CNAME chain but not its end: ask for the end ourselves.
            name = answer.canonical_name
        raise DnsFailure("servfail", f"{host}: CNAME chain longer than {MAX_CNAME_HOPS}")
