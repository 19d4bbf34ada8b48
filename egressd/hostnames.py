"""Host name validation and canonicalisation for policy entries and request targets.

Everything here is pure: no DNS, no sockets. The rule throughout is fail closed: a string
that some resolver, URL parser or libc could read as an IP address is refused as an IP
literal, and anything we cannot confidently validate as a DNS name is refused as invalid.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse
from typing import Literal

__all__ = ["HostError", "HostErrorKind", "is_ip_literal", "normalize_host"]

HostErrorKind = Literal["ip_literal", "wildcard", "port", "scheme", "invalid"]

_MAX_NAME = 253
_MAX_LABEL = 63
# Bounds the work done on hostile input (punycode is superlinear) before precise checks.
_MAX_RAW = 1024

_HEX_COLON_DOT = frozenset("0123456789abcdefABCDEF:.")
# Characters IDNA2003 and UTS 46 treat as label separators besides '.'.
_UNICODE_DOTS = "\u3002\uff0e\uff61"
_DOT_MAP = str.maketrans(dict.fromkeys(_UNICODE_DOTS, "."))
# WHATWG URL parsing deletes ASCII tab and newline anywhere and strips C0 controls and space.
_TAB_NEWLINE = str.maketrans(dict.fromkeys("\t\n\r"))
_C0_AND_SPACE = "".join(chr(c) for c in range(0x21))

# No dot in the scheme class, so "example.com:/x" reads as a bad host rather than a scheme.
_SCHEME_RE = re.compile(r"[a-z][a-z0-9+\-]*:[/\\]", re.IGNORECASE | re.ASCII)
# WHATWG "ends in a number": a last label of ASCII digits, or 0x plus hex digits (even none).
_NUMERIC_LABEL_RE = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*", re.ASCII)
_LDH_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?", re.ASCII)
_PORT_RE = re.compile(r"[0-9]+", re.ASCII)

# Unicode categories allowed in a U-label: letters and combining marks only. This is
# narrower than IDNA2008 PVALID (no symbols, no non-ASCII digits), deliberately.
_ULABEL_CATEGORIES = frozenset({"Ll", "Lm", "Lo", "Mn", "Mc"})


class HostError(ValueError):
    """A host string that egressd refuses; `kind` says which rule it broke."""

    kind: HostErrorKind

    def __init__(self, kind: HostErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[type[HostError], tuple[HostErrorKind, str]]:
        # The default reduce would call HostError(message) and lose the kind.
        return (HostError, (self.kind, str(self)))


def _show(raw: str) -> str:
    # Keep messages readable when the input is huge.
    if len(raw) > 80:
        return repr(raw[:77] + "...")
    return repr(raw)


def _invalid(raw: str, reason: str) -> HostError:
    return HostError("invalid", f"{_show(raw)} is not a valid host name: {reason}")


def _is_ipv4ish(s: str) -> bool:
    """True when a URL parser or inet_aton could read s as an IPv4 address."""
    if s.endswith("."):
        s = s[:-1]
    # Every inet_aton form (dotted, short, hex, octal, integer) ends in a numeric part, and
    # WHATWG treats any name ending in a numeric label as IPv4, so the last label decides.
    last = s.rpartition(".")[2]
    return _NUMERIC_LABEL_RE.fullmatch(last) is not None


def _is_ipv6ish(s: str) -> bool:
    """True when s looks like an IPv6 address, including forms Python's parser rejects."""
    if s.startswith("["):
        s = s[1:].partition("]")[0]
    s = s.partition("%")[0]  # zone id, e.g. fe80::1%eth0 or %25eth0
    if s.endswith("."):
        s = s[:-1]
    # Deliberately looser than ipaddress (e.g. ::ffff:127.1): a colon-rich hex string is
    # never a host name, so calling it an IP literal can only make the error clearer.
    return s.count(":") >= 2 and all(c in _HEX_COLON_DOT for c in s)


def _looks_like_ip(s: str) -> bool:
    if _is_ipv6ish(s) or _is_ipv4ish(s):
        return True
    # Dig out the host a URL parser would see in "user@host:port/path" and friends.
    core = s
    for sep in "/?#\\":
        core = core.partition(sep)[0]
    core = core.rpartition("@")[2]
    tokens = core.split()
    # glibc inet_aton stops at whitespace, so "127.0.0.1 junk" is 127.0.0.1 to it.
    core = tokens[0] if tokens else ""
    if core.startswith("["):
        inner = core[1:].partition("]")[0]
        return _is_ipv6ish(inner) or _is_ipv4ish(inner)
    if _is_ipv6ish(core) or _is_ipv4ish(core):
        return True
    if core.count(":") == 1:
        return _is_ipv4ish(core.partition(":")[0])
    return False


def _ip_candidates(raw: str) -> list[str]:
    """Spellings of raw as various parsers would see it before deciding it is an IP."""
    stripped = raw.translate(_TAB_NEWLINE).strip(_C0_AND_SPACE)
    unquoted = urllib.parse.unquote(stripped)
    # UTS 46 / IDNA2003 map full-width digits, circled digits and ideographic dots to
    # ASCII before IPv4 parsing, so full-width "127.0.0.1" is loopback to a browser.
    mapped = unicodedata.normalize("NFKC", unquoted).translate(_DOT_MAP).strip().lower()
    return [raw, stripped, unquoted, mapped]


def is_ip_literal(raw: str) -> bool:
    """True when raw is, or could be read by some resolver or URL parser as, an IP address.

    Covers every string normalize_host rejects with kind "ip_literal" (it may also be
    true for strings normalize_host rejects earlier as a scheme or wildcard).
    """
    return any(_looks_like_ip(candidate) for candidate in _ip_candidates(raw))


def _has_scheme(raw: str) -> bool:
    return "://" in raw or _SCHEME_RE.match(raw.strip()) is not None


def _port_suffix(raw: str) -> bool:
    host, sep, port = raw.rpartition(":")
    return bool(sep) and bool(host) and ":" not in host and _PORT_RE.fullmatch(port) is not None


def _check_characters(raw: str) -> None:
    if any(c.isspace() for c in raw):
        raise _invalid(raw, "it contains whitespace")
    if any(unicodedata.category(c).startswith("C") for c in raw):
        raise _invalid(raw, "it contains a control or invisible character")
    for char, what in (
        ("%", "percent-encoding"),
        ("@", "user info ('@')"),
        ("/", "a path ('/')"),
        ("\\", "a backslash"),
        ("?", "a query ('?')"),
        ("#", "a fragment ('#')"),
        (":", "a ':'"),
    ):
        if char in raw:
            raise _invalid(raw, f"it contains {what}")
    if any(c in _UNICODE_DOTS for c in raw):
        raise _invalid(raw, "it uses a non-ASCII dot; separate labels with '.'")


def _a_label_from_ascii(raw: str, label: str) -> str:
    label = label.lower()
    if label[:4] == "xn--":
        if len(label) > _MAX_LABEL:
            raise _invalid(raw, "a label is longer than 63 characters")
        # An A-label must decode to a valid U-label that encodes back to exactly itself.
        try:
            u_label = label.encode("ascii").decode("idna")
        except UnicodeError:
            raise _invalid(raw, f"label {label!r} is not valid punycode") from None
        _check_u_label(raw, u_label)
        if _encode_u_label(raw, u_label) != label:
            raise _invalid(raw, f"label {label!r} is not in canonical IDNA form")
    return label


def _check_u_label(raw: str, u_label: str) -> None:
    if u_label.isascii():
        raise _invalid(raw, f"IDN label {u_label!r} has no non-ASCII characters")
    if u_label.startswith("-") or u_label.endswith("-"):
        # Checked on the U-label: its A-label can end in a letter even when it does not.
        raise _invalid(raw, f"label {u_label!r} starts or ends with a hyphen")
    if unicodedata.category(u_label[0]).startswith("M"):
        raise _invalid(raw, f"label {u_label!r} starts with a combining mark")
    for c in u_label:
        if c.isascii():
            if not (c.isalnum() or c == "-") or c.isupper():
                raise _invalid(raw, f"label {u_label!r} contains {c!r}")
        elif unicodedata.category(c) not in _ULABEL_CATEGORIES:
            raise _invalid(raw, f"label {u_label!r} contains {c!r}, which is not a letter")


def _encode_u_label(raw: str, u_label: str) -> str:
    try:
        a_label = u_label.encode("idna").decode("ascii")
        back = a_label.encode("ascii").decode("idna")
    except UnicodeError:
        raise _invalid(raw, f"label {u_label!r} cannot be converted with IDNA") from None
    # IDNA2003 (the stdlib codec) silently maps some characters (ß to ss, soft hyphen to
    # nothing, full-width letters to ASCII) where IDNA2008 differs or the name is a
    # disguise; refusing any label the mapping changes avoids resolving a different name.
    if back != u_label:
        raise _invalid(raw, f"label {u_label!r} is changed by IDNA mapping (to {back!r})")
    return a_label


def _a_label(raw: str, label: str) -> str:
    if label.isascii():
        return _a_label_from_ascii(raw, label)
    u_label = unicodedata.normalize("NFC", label.lower())
    if len(u_label) > _MAX_LABEL:
        # Encoding can only lengthen it; stop before the (superlinear) punycode step.
        raise _invalid(raw, "a label is longer than 63 characters")
    _check_u_label(raw, u_label)
    return _encode_u_label(raw, u_label)


def normalize_host(raw: str) -> str:
    """Return the canonical form of a DNS host name, or raise HostError saying why not.

    Canonical means lower-case ASCII with IDN labels as A-labels and no trailing dot.
    Checks run in the order scheme, wildcard, ip_literal, port, invalid.
    """
    if _has_scheme(raw):
        raise HostError("scheme", f"{_show(raw)} includes a URL scheme; list the bare host name")
    if "*" in raw:
        raise HostError("wildcard", f"{_show(raw)} is a wildcard; list exact host names")
    if is_ip_literal(raw):
        raise HostError(
            "ip_literal", f"{_show(raw)} is, or could be read as, an IP address; list host names instead"
        )
    if _port_suffix(raw):
        raise HostError("port", f"{_show(raw)} includes a port; list the host name without ':port'")
    if not raw:
        raise _invalid(raw, "it is empty")
    if len(raw) > _MAX_RAW:
        raise _invalid(raw, "it is longer than 253 characters")
    _check_characters(raw)

    name = raw[:-1] if raw.endswith(".") else raw
    if name.endswith("."):
        raise _invalid(raw, "it ends with more than one dot")
    if not name:
        raise _invalid(raw, "it is empty")
    labels = name.split(".")
    if len(labels) < 2:
        # Single-label names resolve through search domains to whatever the host decides.
        raise _invalid(raw, "it is a single label; use a fully qualified name")
    if any(not label for label in labels):
        raise _invalid(raw, "it has an empty label")

    a_labels = [_a_label(raw, label) for label in labels]
    for label in a_labels:
        if len(label) > _MAX_LABEL:
            raise _invalid(raw, "a label is longer than 63 characters")
        if label.startswith("-") or label.endswith("-"):
            raise _invalid(raw, f"label {label!r} starts or ends with a hyphen")
        if _LDH_LABEL_RE.fullmatch(label) is None:
            raise _invalid(raw, f"label {label!r} has characters other than letters, digits and hyphens")
    result = ".".join(a_labels)
    if len(result) > _MAX_NAME:
        raise _invalid(raw, "it is longer than 253 characters")
    if is_ip_literal(result):
        # Unreachable given the checks above; kept so a canonical name is never an address.
        raise HostError("ip_literal", f"{_show(raw)} could be read as an IP address; list host names instead")
    return result
