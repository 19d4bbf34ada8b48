"""The forbidden-address table and the checks built on it."""

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egressd.addresses import (
    FORBIDDEN_RANGES,
    ForbiddenRange,
    check_address,
    forbidden_range,
    parse_cidrs,
)

# (address, expected label or None for public). Every FORBIDDEN_RANGES entry must be the
# answer for at least one row; test_every_range_has_a_case enforces that.
CASES: list[tuple[str, str | None]] = [
    # IPv4 ranges, with first and last address inside
    ("0.0.0.0", "this-network"),
    ("0.255.255.255", "this-network"),
    ("10.0.0.0", "rfc1918"),
    ("10.255.255.255", "rfc1918"),
    ("100.64.0.0", "cgnat"),
    ("100.127.255.255", "cgnat"),
    ("100.100.100.200", "metadata"),
    ("100.100.100.201", "cgnat"),
    ("127.0.0.0", "loopback"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.255", "loopback"),
    ("168.63.129.16", "metadata"),
    ("169.254.0.0", "link-local"),
    ("169.254.255.255", "link-local"),
    ("169.254.169.254", "metadata"),
    ("169.254.169.253", "link-local"),
    ("169.254.170.2", "metadata"),
    ("172.16.0.0", "rfc1918"),
    ("172.31.255.255", "rfc1918"),
    ("192.0.0.0", "ietf-protocol"),
    ("192.0.0.255", "ietf-protocol"),
    ("192.0.0.192", "metadata"),
    ("192.0.2.0", "documentation"),
    ("192.0.2.255", "documentation"),
    ("192.88.99.0", "6to4-relay"),
    ("192.88.99.255", "6to4-relay"),
    ("192.168.0.0", "rfc1918"),
    ("192.168.255.255", "rfc1918"),
    ("198.18.0.0", "benchmark"),
    ("198.19.255.255", "benchmark"),
    ("198.51.100.0", "documentation"),
    ("198.51.100.255", "documentation"),
    ("203.0.113.0", "documentation"),
    ("203.0.113.255", "documentation"),
    ("224.0.0.0", "multicast"),
    ("239.255.255.255", "multicast"),
    ("240.0.0.0", "reserved"),
    ("255.255.255.254", "reserved"),
    ("255.255.255.255", "broadcast"),
    # IPv4 first address outside, on each side
    ("1.0.0.0", None),
    ("9.255.255.255", None),
    ("11.0.0.0", None),
    ("100.63.255.255", None),
    ("100.128.0.0", None),
    ("126.255.255.255", None),
    ("128.0.0.0", None),
    ("168.63.129.15", None),
    ("168.63.129.17", None),
    ("169.253.255.255", None),
    ("169.255.0.0", None),
    ("172.15.255.255", None),
    ("172.32.0.0", None),
    ("191.255.255.255", None),
    ("192.0.1.0", None),
    ("192.0.3.0", None),
    ("192.88.98.255", None),
    ("192.88.100.0", None),
    ("192.167.255.255", None),
    ("192.169.0.0", None),
    ("198.17.255.255", None),
    ("198.20.0.0", None),
    ("198.51.99.255", None),
    ("198.51.101.0", None),
    ("203.0.112.255", None),
    ("203.0.114.0", None),
    ("223.255.255.255", None),
    # public controls
    ("8.8.8.8", None),
    ("1.1.1.1", None),
    ("2606:4700::1111", None),
    ("2001:4860:4860::8888", None),
    # IPv6 ranges
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("64:ff9b:1::", "nat64-local"),
    ("64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "nat64-local"),
    ("64:ff9b:1::808:808", "nat64-local"),
    ("64:ff9b:0:ffff:ffff:ffff:ffff:ffff", None),
    ("64:ff9b:2::", None),
    ("100::", "discard-only"),
    ("100::ffff:ffff:ffff:ffff", "discard-only"),
    ("100:0:0:1::", None),
    ("2001:2::", "benchmark"),
    ("2001:2:0:ffff:ffff:ffff:ffff:ffff", "benchmark"),
    ("2001:2:1::", None),
    ("2001:10::", "orchid"),
    ("2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", "orchid"),
    ("2001:20::", "orchid-v2"),
    ("2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", "orchid-v2"),
    ("2001:30::", None),
    ("2001:db8::", "documentation"),
    ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"),
    ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("2001:db9::", None),
    ("3fff::", "documentation"),
    ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"),
    ("3fff:1000::", None),
    ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("5f00::", "srv6"),
    ("5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "srv6"),
    ("5f01::", None),
    ("fc00::", "unique-local"),
    ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "unique-local"),
    ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("fd00:ec2::254", "metadata"),
    ("fd00:ec2::253", "unique-local"),
    ("fd00:ec2::255", "unique-local"),
    ("fe80::", "link-local"),
    ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "link-local"),
    ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", None),
    ("fec0::", "site-local"),
    ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "site-local"),
    ("ff00::", "multicast"),
    ("ff02::1", "multicast"),
    ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "multicast"),
    ("::2", "this-network"),  # IPv4-compatible form of 0.0.0.2
]

# Embedded forms: (address, expected label). Each form appears with a forbidden and a public IPv4.
EMBEDDED_CASES: list[tuple[str, str | None]] = [
    # IPv4-mapped
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:169.254.169.254", "metadata"),
    ("::ffff:10.1.2.3", "rfc1918"),
    ("::ffff:8.8.8.8", None),
    # IPv4-compatible (deprecated)
    ("::127.0.0.1", "loopback"),
    ("::10.0.0.1", "rfc1918"),
    ("::8.8.8.8", None),
    # IPv4-translated
    ("::ffff:0:127.0.0.1", "loopback"),
    ("::ffff:0:192.168.1.1", "rfc1918"),
    ("::ffff:0:8.8.8.8", None),
    # NAT64 well-known prefix
    ("64:ff9b::127.0.0.1", "loopback"),
    ("64:ff9b::169.254.169.254", "metadata"),
    ("64:ff9b::8.8.8.8", None),
    # local-use NAT64: forbidden whatever it carries
    ("64:ff9b:1::8.8.8.8", "nat64-local"),
    ("64:ff9b:1::127.0.0.1", "nat64-local"),
    # 6to4: IPv4 in bits 16..48
    ("2002:7f00:1::", "loopback"),
    ("2002:a9fe:a9fe:1234::1", "metadata"),
    ("2002:c058:6301::", "6to4-relay"),
    ("2002:0808:0808::1", None),
    # Teredo: server in bits 32..64, client bit-inverted in the last 32 bits
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # client 127.0.0.1
    ("2001:0:4136:e378:8000:63bf:5601:5601", "metadata"),  # client 169.254.169.254
    ("2001:0:7f00:1:8000:63bf:f7f7:f7f7", "loopback"),  # server 127.0.0.1, client 8.8.8.8
    ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", None),  # server 65.54.227.120, client 8.8.8.8
]


def _teredo(server: str, client: str) -> str:
    value = (0x2001 << 112) | (int(IPv4Address(server)) << 64) | (0x8000_63BF << 32)
    value |= ~int(IPv4Address(client)) & 0xFFFFFFFF
    return str(IPv6Address(value))


def _label(addr: str) -> str | None:
    found = forbidden_range(ipaddress.ip_address(addr))
    return None if found is None else found.label


@pytest.mark.parametrize(("addr", "label"), CASES)
def test_direct_ranges(addr: str, label: str | None) -> None:
    assert _label(addr) == label


@pytest.mark.parametrize(("addr", "label"), EMBEDDED_CASES)
def test_embedded_forms(addr: str, label: str | None) -> None:
    assert _label(addr) == label


def test_teredo_helper_matches_hand_written_cases() -> None:
    # The Teredo rows above are written out by hand; a typo would test the wrong client.
    assert _teredo("65.54.227.120", "127.0.0.1") == str(IPv6Address("2001:0:4136:e378:8000:63bf:80ff:fffe"))
    assert _teredo("65.54.227.120", "169.254.169.254") == str(
        IPv6Address("2001:0:4136:e378:8000:63bf:5601:5601")
    )
    assert _teredo("127.0.0.1", "8.8.8.8") == str(IPv6Address("2001:0:7f00:1:8000:63bf:f7f7:f7f7"))


def test_every_range_has_a_case() -> None:
    answered = {forbidden_range(ipaddress.ip_address(addr)) for addr, _ in CASES}
    missing = [entry for entry in FORBIDDEN_RANGES if entry not in answered]
    assert not missing


@pytest.mark.parametrize("entry", FORBIDDEN_RANGES, ids=lambda e: f"{e.network}-{e.label}")
def test_range_edges_are_forbidden(entry: ForbiddenRange) -> None:
    for addr in (entry.network.network_address, entry.network.broadcast_address):
        found = forbidden_range(addr)
        assert found is not None
        assert addr in found.network
        assert found.network.prefixlen >= entry.network.prefixlen


def test_result_is_a_table_entry() -> None:
    for addr, label in CASES + EMBEDDED_CASES:
        found = forbidden_range(ipaddress.ip_address(addr))
        if label is not None:
            assert found in FORBIDDEN_RANGES


def test_table_is_well_formed() -> None:
    networks = [entry.network for entry in FORBIDDEN_RANGES]
    assert len(networks) == len(set(networks))
    for entry in FORBIDDEN_RANGES:
        assert entry.label
        assert entry.label == entry.label.lower()
        assert " " not in entry.label


def test_metadata_wins_over_containing_ranges() -> None:
    assert _label("169.254.169.254") == "metadata"
    assert _label("fd00:ec2::254") == "metadata"
    assert _label("192.0.0.192") == "metadata"
    assert _label("100.100.100.200") == "metadata"


def test_scoped_ipv6_is_judged_by_its_address() -> None:
    assert _label("fe80::1%eth0") == "link-local"


# --- allow_cidrs ---

OPEN_LOOPBACK = parse_cidrs(["127.0.0.0/8"])


@pytest.mark.parametrize(
    ("addr", "allow", "label"),
    [
        ("127.0.0.5", OPEN_LOOPBACK, None),
        ("::ffff:127.0.0.5", OPEN_LOOPBACK, None),
        ("64:ff9b::127.0.0.5", OPEN_LOOPBACK, None),
        ("2002:7f00:5::", OPEN_LOOPBACK, None),
        ("10.0.0.1", OPEN_LOOPBACK, "rfc1918"),
        ("::ffff:10.0.0.1", OPEN_LOOPBACK, "rfc1918"),
        ("::1", OPEN_LOOPBACK, "loopback"),  # an IPv4 opening does not open IPv6 loopback
        ("64:ff9b:1::127.0.0.5", OPEN_LOOPBACK, "nat64-local"),
        ("8.8.8.8", (), None),
        ("127.0.0.1", (), "loopback"),
        ("169.254.169.254", parse_cidrs(["169.254.169.254/32"]), None),
        ("169.254.169.253", parse_cidrs(["169.254.169.254/32"]), "link-local"),
        ("fd00:ec2::254", parse_cidrs(["fd00::/8"]), None),
        ("::1", parse_cidrs(["::1/128"]), None),
        ("10.0.0.1", parse_cidrs(["::/0"]), "rfc1918"),  # families do not mix
        ("::ffff:10.0.0.1", parse_cidrs(["::ffff:0:0/96"]), None),  # a direct IPv6 opening
        # Teredo: both embedded addresses must be public or opened
        (_teredo("127.0.0.1", "10.0.0.1"), OPEN_LOOPBACK, "rfc1918"),
        (_teredo("127.0.0.1", "8.8.8.8"), OPEN_LOOPBACK, None),
        (_teredo("127.0.0.1", "127.0.0.2"), OPEN_LOOPBACK, None),
    ],
)
def test_check_address(addr: str, allow: tuple[IPv4Network | IPv6Network, ...], label: str | None) -> None:
    found = check_address(ipaddress.ip_address(addr), allow)
    assert (None if found is None else found.label) == label


def test_check_address_matches_forbidden_range_without_allow() -> None:
    for addr, _ in CASES + EMBEDDED_CASES:
        ip = ipaddress.ip_address(addr)
        assert check_address(ip, ()) == forbidden_range(ip)


# --- parse_cidrs ---


def test_parse_cidrs_valid() -> None:
    assert parse_cidrs(["10.0.0.0/8", "fd00::/8", "192.0.2.7"]) == (
        IPv4Network("10.0.0.0/8"),
        IPv6Network("fd00::/8"),
        IPv4Network("192.0.2.7/32"),
    )
    assert parse_cidrs([]) == ()
    assert parse_cidrs(iter(["::1/128"])) == (IPv6Network("::1/128"),)


@pytest.mark.parametrize(
    "bad",
    [
        "10.0.0.1/8",
        "10.0.0.0/33",
        "example.com",
        "",
        " 10.0.0.0/8",
        "10.0.0.0/8 ",
        "fe80::%eth0/64",
        "::1/129",
    ],
)
def test_parse_cidrs_rejects_and_names_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match="not a valid CIDR") as info:
        parse_cidrs(["192.168.0.0/16", bad])
    assert repr(bad) in str(info.value)


def test_parse_cidrs_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="expected a string"):
        parse_cidrs([167772160])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        parse_cidrs("10.0.0.0/8")


# --- properties ---

_V4_FORBIDDEN = [entry for entry in FORBIDDEN_RANGES if entry.network.version == 4]


@st.composite
def forbidden_ipv4(draw: st.DrawFn) -> IPv4Address:
    entry = draw(st.sampled_from(_V4_FORBIDDEN))
    net = entry.network
    offset = draw(st.integers(0, net.num_addresses - 1))
    return IPv4Address(int(net.network_address) + offset)


_BITS16 = st.integers(0, 0xFFFF)
_BITS32 = st.integers(0, 0xFFFFFFFF)
_BITS64 = st.integers(0, (1 << 64) - 1)


@st.composite
def embedded_forms(draw: st.DrawFn, v4: IPv4Address) -> list[IPv6Address]:
    """v4 in every IPv6 form that carries an IPv4, with the free bits drawn at random."""
    n = int(v4)
    public_server = int(IPv4Address("65.54.227.120"))
    return [
        IPv6Address((0xFFFF << 32) | n),  # mapped
        IPv6Address(n),  # compatible
        IPv6Address((0xFFFF << 48) | n),  # translated
        IPv6Address((0x64FF9B << 96) | n),  # NAT64
        IPv6Address((0x64FF9B0001 << 80) | (draw(_BITS64) << 16) | draw(_BITS16)),  # local NAT64
        IPv6Address((0x2002 << 112) | (n << 80) | (draw(_BITS16) << 64) | draw(_BITS64)),  # 6to4
        IPv6Address((0x2001 << 112) | (n << 64) | (draw(_BITS32) << 32) | draw(_BITS32)),  # Teredo server
        IPv6Address((0x2001 << 112) | (public_server << 64) | (draw(_BITS32) << 32) | (~n & 0xFFFFFFFF)),
    ]


@given(data=st.data(), v4=forbidden_ipv4())
def test_forbidden_ipv4_is_forbidden_in_every_embedding(data: st.DataObject, v4: IPv4Address) -> None:
    assert forbidden_range(v4) is not None
    for v6 in data.draw(embedded_forms(v4)):
        assert forbidden_range(v6) is not None, v6
        assert check_address(v6, ()) is not None, v6


@given(v4=forbidden_ipv4())
def test_opening_an_ipv4_opens_its_mapped_form(v4: IPv4Address) -> None:
    allow = (IPv4Network(v4),)
    assert check_address(v4, allow) is None
    assert check_address(IPv6Address((0xFFFF << 32) | int(v4)), allow) is None
