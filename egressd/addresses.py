"""Which destination addresses egressd refuses to connect to.

The decision rests on one explicit table of CIDRs, not on ipaddress's is_private /
is_global, whose answers have changed between Python releases and miss ranges we care
about. IPv6 forms that carry an IPv4 address (mapped, compatible, translated, NAT64, 6to4,
Teredo) are judged by the IPv4 they carry, so a forbidden IPv4 cannot be reached through
them. Such a form carrying a public IPv4 is allowed, because mapped and NAT64 addresses
are what a dual-stack socket or a DNS64 resolver legitimately hands us for public hosts.
The local-use NAT64 prefix 64:ff9b:1::/48 is forbidden whole: where a local translator
puts the IPv4 inside it is site configuration we cannot know.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

__all__ = [
    "FORBIDDEN_RANGES",
    "ForbiddenRange",
    "check_address",
    "forbidden_range",
    "parse_cidrs",
]

type Address = IPv4Address | IPv6Address
type Network = IPv4Network | IPv6Network


@dataclass(frozen=True)
class ForbiddenRange:
    """A range egressd will not connect to, with a short stable label for audit and errors."""

    network: Network
    label: str


def _r(cidr: str, label: str) -> ForbiddenRange:
    return ForbiddenRange(ipaddress.ip_network(cidr, strict=True), label)


# Overlaps are intended: lookups return the longest (most specific) match, so the
# metadata /32s and /128 win over the ranges that contain them.
FORBIDDEN_RANGES: tuple[ForbiddenRange, ...] = (
    # IPv4
    _r("0.0.0.0/8", "this-network"),
    _r("10.0.0.0/8", "rfc1918"),
    _r("100.64.0.0/10", "cgnat"),
    _r("100.100.100.200/32", "metadata"),  # Alibaba Cloud
    _r("127.0.0.0/8", "loopback"),
    _r("168.63.129.16/32", "metadata"),  # Azure WireServer; public space, host-only service
    _r("169.254.0.0/16", "link-local"),
    _r("169.254.169.254/32", "metadata"),  # AWS, GCP, Azure, DigitalOcean, OpenStack
    _r("169.254.170.2/32", "metadata"),  # AWS ECS task credentials
    _r("172.16.0.0/12", "rfc1918"),
    _r("192.0.0.0/24", "ietf-protocol"),
    _r("192.0.0.192/32", "metadata"),  # Oracle Cloud
    _r("192.0.2.0/24", "documentation"),
    _r("192.88.99.0/24", "6to4-relay"),
    _r("192.168.0.0/16", "rfc1918"),
    _r("198.18.0.0/15", "benchmark"),
    _r("198.51.100.0/24", "documentation"),
    _r("203.0.113.0/24", "documentation"),
    _r("224.0.0.0/4", "multicast"),
    _r("240.0.0.0/4", "reserved"),
    _r("255.255.255.255/32", "broadcast"),
    # IPv6
    _r("::/128", "unspecified"),
    _r("::1/128", "loopback"),
    _r("64:ff9b:1::/48", "nat64-local"),
    _r("100::/64", "discard-only"),
    _r("2001:2::/48", "benchmark"),
    _r("2001:10::/28", "orchid"),
    _r("2001:20::/28", "orchid-v2"),
    _r("2001:db8::/32", "documentation"),
    _r("3fff::/20", "documentation"),
    _r("5f00::/16", "srv6"),
    _r("fc00::/7", "unique-local"),
    _r("fd00:ec2::254/128", "metadata"),  # AWS IMDS over IPv6
    _r("fe80::/10", "link-local"),
    _r("fec0::/10", "site-local"),
    _r("ff00::/8", "multicast"),
)

_V4_RANGES = tuple(r for r in FORBIDDEN_RANGES if r.network.version == 4)
_V6_RANGES = tuple(r for r in FORBIDDEN_RANGES if r.network.version == 6)

_LOW32 = 0xFFFFFFFF
# Prefixes whose last 32 bits are an IPv4 address.
_LOW32_EMBEDDINGS = (
    IPv6Network("::ffff:0:0/96"),  # IPv4-mapped
    IPv6Network("::/96"),  # IPv4-compatible (deprecated)
    IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated (SIIT)
    IPv6Network("64:ff9b::/96"),  # NAT64 well-known prefix
)
_SIX_TO_FOUR = IPv6Network("2002::/16")
_TEREDO = IPv6Network("2001::/32")


def _longest_match(addr: Address, ranges: tuple[ForbiddenRange, ...]) -> ForbiddenRange | None:
    best: ForbiddenRange | None = None
    for entry in ranges:
        if addr in entry.network and (best is None or entry.network.prefixlen > best.network.prefixlen):
            best = entry
    return best


def _embedded_ipv4s(addr: IPv6Address) -> tuple[IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries, most relevant destination first."""
    value = int(addr)
    if any(addr in net for net in _LOW32_EMBEDDINGS):
        return (IPv4Address(value & _LOW32),)
    if addr in _SIX_TO_FOUR:
        return (IPv4Address((value >> 80) & _LOW32),)
    if addr in _TEREDO:
        # The client (bit-inverted in the last 32 bits) is where packets end up; the
        # server (bits 32..64) is checked too since a relay will talk to it.
        client = IPv4Address(~value & _LOW32)
        server = IPv4Address((value >> 64) & _LOW32)
        return (client, server)
    return ()


def _direct_range(addr: Address) -> ForbiddenRange | None:
    return _longest_match(addr, _V4_RANGES if addr.version == 4 else _V6_RANGES)


def forbidden_range(addr: Address) -> ForbiddenRange | None:
    """The forbidden range addr falls in (looking inside IPv6 forms that embed an IPv4), or None.

    The result is always an entry of FORBIDDEN_RANGES. For an IPv6 address forbidden
    because of the IPv4 it embeds, that is the IPv4 entry (so its network is IPv4).
    A direct IPv6 match wins over an embedded one, so ::1 is "loopback", not 0.0.0.1.
    """
    direct = _direct_range(addr)
    if direct is not None or isinstance(addr, IPv4Address):
        return direct
    for embedded in _embedded_ipv4s(addr):
        found = _direct_range(embedded)
        if found is not None:
            return found
    return None


def _allowed(addr: Address, allow_cidrs: Sequence[Network]) -> bool:
    # Membership across families is False in ipaddress, so mixed lists are fine.
    return any(addr in net for net in allow_cidrs)


def check_address(addr: Address, allow_cidrs: Sequence[Network]) -> ForbiddenRange | None:
    """None when addr may be connected to: public, or inside one of the operator's allow_cidrs.

    Otherwise the forbidden range that blocks it. An IPv6 form embedding an IPv4 is
    allowed when every embedded IPv4 is public or inside allow_cidrs; a direct IPv6
    match (e.g. ::1, or the local-use NAT64 prefix) is only lifted by an IPv6 allow entry.
    """
    if _allowed(addr, allow_cidrs):
        return None
    direct = _direct_range(addr)
    if direct is not None or isinstance(addr, IPv4Address):
        return direct
    for embedded in _embedded_ipv4s(addr):
        if _allowed(embedded, allow_cidrs):
            continue
        found = _direct_range(embedded)
        if found is not None:
            return found
    return None


def parse_cidrs(values: Iterable[str]) -> tuple[Network, ...]:
    """Parse CIDR strings strictly (no host bits set); a bare address means a /32 or /128.

    Raises ValueError naming the first bad value.
    """
    if isinstance(values, str):
        # A lone string is iterable too; parsing it character by character is never meant.
        raise TypeError("parse_cidrs takes a list of CIDR strings, not a single string")
    networks: list[Network] = []
    for value in values:
        if not isinstance(value, str):
            # ip_network would take an int as an address; config values must be text.
            raise ValueError(f"{value!r} is not a valid CIDR: expected a string")
        if "%" in value:
            # ipaddress accepts a zone id but ignores it when matching, which would widen the rule.
            raise ValueError(f"{value!r} is not a valid CIDR: zone ids are not supported")
        try:
            networks.append(ipaddress.ip_network(value, strict=True))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{value!r} is not a valid CIDR: {exc}") from None
    return tuple(networks)
