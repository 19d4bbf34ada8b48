"""Host name canonicalisation and the refusal of IP literals, wildcards, ports and schemes."""

import copy
import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egressd.hostnames import HostError, is_ip_literal, normalize_host

VALID: list[tuple[str, str]] = [
    ("example.com", "example.com"),
    ("Example.COM", "example.com"),
    ("example.com.", "example.com"),
    ("EXAMPLE.COM.", "example.com"),
    ("a.b", "a.b"),
    ("api.github.com", "api.github.com"),
    ("a-b.example.co.uk", "a-b.example.co.uk"),
    ("1password.com", "1password.com"),
    ("123.example.com", "123.example.com"),  # numeric labels are fine unless last
    ("0x1f.example.com", "0x1f.example.com"),
    ("example.1a", "example.1a"),  # not all digits, not 0x-hex: not a number to WHATWG
    ("example.0xg", "example.0xg"),
    ("r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com"),  # '--' at 3-4 is real DNS
    ("bücher.example", "xn--bcher-kva.example"),
    ("BÜCHER.example", "xn--bcher-kva.example"),
    ("bu\u0308cher.example", "xn--bcher-kva.example"),  # decomposed form, NFC first
    ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("XN--BCHER-KVA.EXAMPLE.", "xn--bcher-kva.example"),
    ("münchen.de", "xn--mnchen-3ya.de"),
    ("例え.jp", "xn--r8jz45g.jp"),
    ("xn--r8jz45g.jp", "xn--r8jz45g.jp"),
    ("a" * 63 + ".com", "a" * 63 + ".com"),
    (".".join(["a" * 63] * 3 + ["b" * 61]), ".".join(["a" * 63] * 3 + ["b" * 61])),  # 253
    (".".join(["a" * 63] * 3 + ["b" * 61]) + ".", ".".join(["a" * 63] * 3 + ["b" * 61])),
]

IP_LITERALS: list[str] = [
    # dotted quad and IPv6
    "127.0.0.1",
    "127.0.0.1.",
    "8.8.8.8",
    "0.0.0.0",
    "255.255.255.255",
    "::",
    "::1",
    "[::1]",
    "[::1]:443",
    "::ffff:127.0.0.1",
    "[::ffff:7f00:1]",
    "0:0:0:0:0:0:0:1",
    "2001:DB8::1",
    "fe80::1%eth0",
    "[fe80::1%eth0]",
    "[fe80::1%25eth0]:443",
    "::ffff:127.1",  # no parser should accept it, but it is plainly an address
    # integer, hex, octal, short and mixed forms
    "2130706433",
    "2130706433.",
    "0x7f000001",
    "0X7F000001",
    "0x7f.1",
    "0X7F.1",
    "0177.0.0.1",
    "0177.0.0.01",
    "017700000001",
    "127.1",
    "127.0.1",
    "10.1.1",
    "10.1.1.",
    "0x7f.0.0x0.1",
    "0177.0x0.1",
    "0x7f.0.1",
    "0",
    "0x",
    "08.0.0.1",
    "999999999999",
    "1.2.3.4.5",
    # WHATWG: a last label of digits or 0x-hex makes the whole name an IPv4 attempt
    "foo.123",
    "foo.123.",
    "a.0x1f",
    "a.0X1F",
    "example.com.0",
    "a.0x",
    # with a port, user info, path or junk around the address
    "127.0.0.1:80",
    "user@127.0.0.1",
    "127.0.0.1/path",
    "127.0.0.1 foo",  # glibc inet_aton stops at whitespace
    "\t127.0.0.1\n",
    # spellings a URL parser maps to ASCII first
    "\uff11\uff12\uff17.\uff10.\uff10.\uff11",  # full-width digits
    "127\u30020\u30020\u30021",  # ideographic full stops
    "127\uff0e0\uff0e0\uff0e1",  # full-width full stops
    "127.0.0.\u2460",  # circled digit one
    "127%2E0%2E0%2E1",
    "%31%32%37.0.0.1",
]

WILDCARDS = ["*", "*.example.com", "foo.*.com", "*example.com", "*.1.2.3", "example.*"]

SCHEMES = [
    "https://example.com",
    "http://x",
    "HTTPS://EXAMPLE.COM",
    "ftp://example.com/",
    "://example.com",
    "https:/example.com",
    "https:\\\\example.com",
    "https://127.0.0.1",  # scheme is checked first
    "https://*.example.com",
]

PORTS = ["example.com:443", "example.com:8080", "EXAMPLE.com.:443", "bücher.example:443", "a.b:0"]

INVALID: list[tuple[str, str]] = [
    ("", "empty"),
    (".", "empty"),
    ("..", "more than one dot"),
    ("localhost", "single label"),
    ("intranet", "single label"),
    ("localhost.", "single label"),
    ("example.com..", "more than one dot"),
    (".example.com", "empty label"),
    ("a..b.com", "empty label"),
    ("exa_mple.com", "other than letters"),
    ("_dmarc.example.com", "other than letters"),
    ("-foo.example.com", "hyphen"),
    ("foo-.example.com", "hyphen"),
    ("a" * 64 + ".com", "longer than 63"),
    (".".join(["a" * 63] * 3 + ["b" * 62]), "longer than 253"),
    ("x." * 600 + "com", "longer than 253"),
    ("ex ample.com", "whitespace"),
    (" example.com", "whitespace"),
    ("example.com ", "whitespace"),
    ("exa\tmple.com", "whitespace"),
    ("example.com\n", "whitespace"),
    ("exa\u3000mple.com", "whitespace"),
    ("exa\x00mple.com", "control"),
    ("exa\x7fmple.com", "control"),
    ("exa\u200bmple.com", "control or invisible"),
    ("exa\u00admple.com", "control or invisible"),  # soft hyphen, dropped by IDNA2003
    ("%65xample.com", "percent"),
    ("user@example.com", "'@'"),
    ("example.com/path", "path"),
    ("example.com:/path", "path"),
    ("example.com?q=1", "query"),
    ("example.com#frag", "fragment"),
    ("example.com\\", "backslash"),
    ("example.com:", "':'"),
    ("example.com:https", "':'"),
    ("user:pass@example.com", "'@'"),
    ("[example.com]", "other than letters"),
    ("example\u3002com", "non-ASCII dot"),
    ("xn--.com", "punycode"),
    ("xn--zz.com", "punycode"),
    ("xn--a.com", "punycode"),
    ("xn--abc-.com", "punycode"),  # decodes to plain ASCII
    ("xn--bcher-kva-.com", "punycode"),
    ("straße.de", "IDNA mapping"),  # IDNA2003 says strasse, IDNA2008 says xn--strae-oqa
    ("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com", "IDNA mapping"),  # full-width letters
    ("☃.net", "not a letter"),
    ("\u0663\u0664.example", "not a letter"),  # Arabic-Indic digits
    ("\u0301abc.example", "combining mark"),
    ("b\u00fccher-.example", "hyphen"),
]


def _kind(raw: str) -> str | None:
    try:
        normalize_host(raw)
    except HostError as err:
        return err.kind
    return None


@pytest.mark.parametrize(("raw", "canonical"), VALID)
def test_valid(raw: str, canonical: str) -> None:
    assert normalize_host(raw) == canonical
    assert normalize_host(canonical) == canonical
    assert not is_ip_literal(raw)


@pytest.mark.parametrize("raw", IP_LITERALS)
def test_ip_literals(raw: str) -> None:
    with pytest.raises(HostError) as info:
        normalize_host(raw)
    assert info.value.kind == "ip_literal"
    assert "IP address" in str(info.value)
    assert is_ip_literal(raw)


@pytest.mark.parametrize("raw", WILDCARDS)
def test_wildcards(raw: str) -> None:
    with pytest.raises(HostError) as info:
        normalize_host(raw)
    assert info.value.kind == "wildcard"
    assert str(info.value) == f"{raw!r} is a wildcard; list exact host names"


@pytest.mark.parametrize("raw", SCHEMES)
def test_schemes(raw: str) -> None:
    assert _kind(raw) == "scheme"


@pytest.mark.parametrize("raw", PORTS)
def test_ports(raw: str) -> None:
    assert _kind(raw) == "port"
    assert not is_ip_literal(raw)


@pytest.mark.parametrize(("raw", "reason"), INVALID)
def test_invalid(raw: str, reason: str) -> None:
    with pytest.raises(HostError) as info:
        normalize_host(raw)
    assert info.value.kind == "invalid"
    assert reason in str(info.value)
    assert not is_ip_literal(raw)


def test_host_error_is_a_value_error_with_one_sentence() -> None:
    with pytest.raises(ValueError, match="not a valid host name") as info:
        normalize_host("exa_mple.com")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("'exa_mple.com' ")


def test_host_error_survives_copying() -> None:
    # copy goes through __reduce__, the same path pickling (e.g. to a worker) takes.
    err = HostError("port", "'a.b:1' includes a port; list the host name without ':port'")
    clone = copy.deepcopy(err)
    assert (clone.kind, str(clone)) == (err.kind, str(err))


def test_long_input_is_shortened_in_the_message() -> None:
    with pytest.raises(HostError) as info:
        normalize_host("a" * 5000)
    assert len(str(info.value)) < 200


# --- properties ---

_U32 = st.integers(0, 2**32 - 1)


@st.composite
def _number(draw: st.DrawFn, value: int) -> str:
    style = draw(st.sampled_from(["dec", "hex", "HEX", "oct"]))
    if style == "dec":
        return str(value)
    if style == "hex":
        return f"0x{value:x}"
    if style == "HEX":
        return f"0X{value:X}"
    return f"0{value:o}"


@st.composite
def inet_aton_spellings(draw: st.DrawFn, value: int) -> str:
    """value as inet_aton spells it: 1 to 4 parts, the last taking the remaining bytes."""
    parts = draw(st.integers(1, 4))
    octets = list(value.to_bytes(4, "big"))
    leading = octets[: parts - 1]
    rest = int.from_bytes(bytes(octets[parts - 1 :]), "big")
    return ".".join([*(draw(_number(o)) for o in leading), draw(_number(rest))])


@given(data=st.data(), value=_U32)
def test_every_inet_aton_spelling_is_an_ip_literal(data: st.DataObject, value: int) -> None:
    spelling = data.draw(inet_aton_spellings(value))
    # The spellings are what glibc itself accepts, so the property covers real parsers.
    assert socket.inet_aton(spelling) == value.to_bytes(4, "big")
    for raw in (spelling, spelling + ".", f"[{spelling}]", f"{spelling}:443"):
        assert is_ip_literal(raw)
        assert _kind(raw) == "ip_literal"


@given(value=st.integers(0, 2**128 - 1), bracket=st.booleans())
def test_every_ipv6_address_is_an_ip_literal(value: int, bracket: bool) -> None:
    addr = ipaddress.IPv6Address(value)
    for text in (str(addr), addr.exploded):
        raw = f"[{text}]" if bracket else text
        assert _kind(raw) == "ip_literal"


_NAMEISH = st.text(alphabet="abcx019-.ü_AZ", min_size=1, max_size=30)


@given(raw=_NAMEISH)
def test_canonical_names_are_stable_and_never_addresses(raw: str) -> None:
    try:
        canonical = normalize_host(raw)
    except HostError:
        return
    assert normalize_host(canonical) == canonical
    assert canonical.isascii()
    assert canonical == canonical.lower()
    assert not is_ip_literal(canonical)
    with pytest.raises(ValueError):
        ipaddress.ip_address(canonical)
    with pytest.raises(OSError):
        socket.inet_aton(canonical)
