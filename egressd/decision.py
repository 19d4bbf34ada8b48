"""The allow/deny decision as pure functions: no sockets, no DNS, no clock.

The mitmproxy addons gather facts (the CONNECT target, resolved addresses, the request's line and headers)
and ask these functions; everything the gate refuses is decided here, so it can be tested exhaustively.
"""

import ipaddress
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from egressd.addresses import check_address
from egressd.hostnames import HostError, normalize_host
from egressd.policy import Policy, Rule
from egressd.reasons import ALLOW, Decision, Reason, deny

HTTPS_PORT = 443
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Target:
    """An allowed CONNECT target: the canonical host name and the policy rules that cover it."""

    host: str
    rules: tuple[Rule, ...]


def decide_target(policy: Policy, raw_host: str, port: int) -> Decision | Target:
    """Steps 3-5 at the CONNECT: a DNS name (not an IP in any spelling), port 443, a host the policy allows."""
    try:
        host = normalize_host(raw_host)
    except HostError as err:
        if err.kind == "ip_literal":
            return deny(Reason.IP_LITERAL, f"{raw_host!r} is an IP address; egress is by host name only")
        return deny(Reason.INVALID_HOST, str(err))
    if port != HTTPS_PORT:
        return deny(Reason.PORT_NOT_ALLOWED, f"port {port} is not allowed; only HTTPS on port 443")
    rules = policy.rules_for(host)
    if not rules:
        return deny(Reason.HOST_NOT_ALLOWED, f"{host} is not allowed by policy {policy.label}")
    return Target(host, rules)


def decide_addresses(
    host: str,
    addresses: Sequence[IPAddress],
    allow_cidrs: Sequence[Network],
    own_endpoints: Collection[tuple[IPAddress, int]] = (),
) -> Decision:
    """Step 6: every resolved address must be public (or opened by the operator), and none may be egressd."""
    if not addresses:
        return deny(Reason.DNS_FAILURE, f"{host} has no A or AAAA records")
    for addr in addresses:
        forbidden = check_address(addr, allow_cidrs)
        if forbidden is not None:
            return deny(
                Reason.FORBIDDEN_ADDRESS,
                f"{host} resolves to {addr}, which is in a forbidden range ({forbidden.label})",
            )
        if any(_is_own_endpoint(addr, endpoint) for endpoint in own_endpoints):
            return deny(Reason.FORBIDDEN_ADDRESS, f"{host} resolves to {addr}, which is egressd itself")
    return ALLOW


def _is_own_endpoint(addr: IPAddress, endpoint: tuple[IPAddress, int]) -> bool:
    listen_ip, listen_port = endpoint
    # '::ffff:a.b.c.d' reaches the IPv4 listener a.b.c.d (and the other way round): compare the IPv4 forms.
    return listen_port == HTTPS_PORT and (_unmapped(listen_ip) == _unmapped(addr) or listen_ip.is_unspecified)


def _unmapped(addr: IPAddress) -> IPAddress:
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return mapped if mapped is not None else addr


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the gate needs to know of one request inside a tunnel, as the client sent it."""

    method: str
    path: str  # the request path with its query, as sent
    authority: str  # absolute-form authority or HTTP/2 :authority; "" when absent
    host_headers: tuple[str, ...]
    sni: str | None
    content_lengths: tuple[str, ...] = ()
    transfer_encoding: bool = False
    upgrade: str = ""  # the Upgrade header, "" when absent
    http2_settings: bool = False


def decide_request(target: Target, facts: RequestFacts) -> Decision:
    """Steps 8-11 for one request in a tunnel to `target`."""
    host = target.host
    if facts.sni is None or _canonical(facts.sni) != host:
        return deny(Reason.SNI_MISMATCH, f"the TLS server name {facts.sni!r} is not the tunnel's host {host}")
    framing = _framing_problem(facts)
    if framing:
        return deny(Reason.BAD_REQUEST, framing)
    for named in (facts.authority, *facts.host_headers):
        if named and not _names_host(named, host):
            return deny(Reason.HOST_MISMATCH, f"the request names {named!r}, but this tunnel is for {host}")
    if not facts.authority and not facts.host_headers:
        return deny(Reason.BAD_REQUEST, "the request names no host")
    path = facts.path.partition("?")[0]
    bad_path = _path_problem(path)
    if bad_path:
        return deny(Reason.INVALID_PATH, bad_path)
    by_method = [rule for rule in target.rules if rule.allows_method(facts.method)]
    if not by_method:
        return deny(Reason.METHOD_NOT_ALLOWED, f"{facts.method} is not allowed to {host}")
    by_path = [rule for rule in by_method if rule.allows_path(path)]
    if not by_path:
        return deny(Reason.PATH_NOT_ALLOWED, f"{facts.method} {path} is not allowed to {host}")
    if facts.upgrade and not any(rule.websocket for rule in by_path):
        return deny(Reason.WEBSOCKET_NOT_ALLOWED, f"WebSocket upgrades to {host} are not allowed")
    return ALLOW


def _canonical(name: str) -> str | None:
    try:
        return normalize_host(name)
    except HostError:
        return None


def _names_host(authority: str, host: str) -> bool:
    """'host', 'host:443' (any case, one trailing dot) name the tunnel's host; anything else does not."""
    name, sep, port = authority.rpartition(":")
    if not sep or name.endswith("]"):
        name, port = authority, ""
    if port and port != str(HTTPS_PORT):
        return False
    if sep and not port:
        return False
    return _canonical(name) == host


def _framing_problem(facts: RequestFacts) -> str:
    """Ambiguous or tunnel-escaping framing is refused, never normalised."""
    if facts.method == "CONNECT":
        return "CONNECT inside a tunnel is not allowed"
    if len(facts.content_lengths) > 1:
        return "more than one Content-Length header"
    if facts.content_lengths and not _is_ascii_number(facts.content_lengths[0].strip()):
        return "Content-Length is not a number"
    if facts.content_lengths and facts.transfer_encoding:
        return "both Content-Length and Transfer-Encoding"
    if len(facts.host_headers) > 1:
        return "more than one Host header"
    tokens = {token.strip().lower().partition("/")[0] for token in facts.upgrade.split(",") if token.strip()}
    if "h2c" in tokens or facts.http2_settings:
        return "h2c upgrades are not allowed"
    if tokens - {"websocket"}:
        return f"upgrade to {facts.upgrade!r} is not allowed"
    return ""


def _is_ascii_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _path_problem(path: str) -> str:
    if not path.startswith("/"):
        return f"the path {path!r} does not start with '/'"
    lowered = path.lower()
    if "\\" in path or "%5c" in lowered:
        return "the path contains a backslash"
    if "%2f" in lowered:
        return "the path contains an encoded '/'"
    for segment in path.split("/"):
        # Decode repeatedly: '%252e' is '.' to a server that decodes twice.
        decoded, previous = segment, None
        try:
            while decoded != previous and "%" in decoded:
                previous, decoded = decoded, unquote(decoded, errors="strict")
        except UnicodeDecodeError:
            # Overlong or broken UTF-8 ('%c0%ae') is '.' to some servers.
            return "the path contains percent-encoding that is not valid UTF-8"
        # Some servers ignore ';parameters' in a segment ('..;' is '..' to Tomcat).
        if decoded.partition(";")[0] in (".", ".."):
            return "the path contains a dot-segment"
        if "/" in decoded or "\\" in decoded:
            # '%252f' is '/' to a server that decodes twice, and would split '..%252f' into a dot-segment.
            return "the path contains an encoded '/' or backslash"
    return ""
