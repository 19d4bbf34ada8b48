"""The gate's decisions as pure functions: CONNECT target, resolved addresses, and requests in a tunnel."""

import ipaddress
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egressd.decision import RequestFacts, Target, decide_addresses, decide_request, decide_target
from egressd.hostnames import HostError, normalize_host
from egressd.policy import Policy, parse_policy
from egressd.reasons import Decision, Reason

HOST = "api.example.com"

POLICY = parse_policy(
    """
name = "test"
version = 2

[[allow]]
host = "api.example.com"
reason = "Read and write the API"
methods = ["GET", "POST"]
paths = ["/v1/items", "/v1/items/*", "/repos/**", "/bot*/send"]

[[allow]]
host = "api.example.com"
reason = "Delete old items"
methods = ["DELETE"]
paths = ["/v1/items/*"]

[[allow]]
host = "stream.example.com"
reason = "Live updates"
methods = ["GET"]
paths = ["/ws"]
websocket = true

[[allow]]
host = "bücher.example"
reason = "Books"
""",
    "test.toml",
)

OPEN_WEB = parse_policy(
    """
name = "researcher"
version = 1

[open_web]
reason = "Read public sources"
methods = ["GET", "HEAD"]
""",
    "researcher.toml",
)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


def reason_of(result: Decision | Target) -> Reason | None:
    assert isinstance(result, Decision), f"expected a refusal, got {result!r}"
    assert not result.allowed
    assert result.detail
    return result.reason


def target(host: str = HOST, policy: Policy = POLICY) -> Target:
    result = decide_target(policy, host, 443)
    assert isinstance(result, Target), result
    return result


def facts(
    method: str = "GET",
    path: str = "/v1/items",
    *,
    host: str = HOST,
    authority: str = "",
    host_headers: tuple[str, ...] | None = None,
    sni: str | None = "",
    content_lengths: tuple[str, ...] = (),
    transfer_encoding: bool = False,
    upgrade: str = "",
    http2_settings: bool = False,
) -> RequestFacts:
    return RequestFacts(
        method=method,
        path=path,
        authority=authority,
        host_headers=(host,) if host_headers is None else host_headers,
        sni=host if sni == "" else sni,
        content_lengths=content_lengths,
        transfer_encoding=transfer_encoding,
        upgrade=upgrade,
        http2_settings=http2_settings,
    )


# --- decide_target --------------------------------------------------------------------------------------


def test_allowed_target_carries_its_rules() -> None:
    result = target()
    assert result.host == HOST
    assert result.rules == POLICY.allow[:2]


@pytest.mark.parametrize(
    "raw", ["API.Example.COM", "api.example.com.", "API.EXAMPLE.COM."]
)
def test_target_host_is_compared_case_insensitively_with_one_trailing_dot(raw: str) -> None:
    assert target(raw).host == HOST


def test_idn_target_matches_its_a_label() -> None:
    assert target("bücher.example").host == "xn--bcher-kva.example"
    assert target("XN--BCHER-KVA.example").host == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    "raw",
    [
        "127.0.0.1",
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "017700000001",
        "0x7f.1",
        "1.2.3.4",
        "8.8.8.8.",
        "::1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "::ffff:7f00:1",
        "fe80::1%eth0",
        "[2001:db8::1]",
        "169.254.169.254",
        "0",
        "\uff11\uff12\uff17.\uff10.\uff10.\uff11",  # full-width digits
        "api.example.1",  # a name whose last label is a number reads as IPv4 to URL parsers
    ],
)
def test_ip_literal_in_any_spelling(raw: str) -> None:
    assert reason_of(decide_target(POLICY, raw, 443)) is Reason.IP_LITERAL
    assert reason_of(decide_target(OPEN_WEB, raw, 443)) is Reason.IP_LITERAL


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "localhost",
        "localhost.",
        "api..example.com",
        "api.example.com..",
        "-api.example.com",
        "api-.example.com",
        "api_x.example.com",
        "api example.com",
        "api.example.com/x",
        "user@api.example.com",
        "api.example.com%00",
        "*.example.com",
        "a" * 64 + ".example.com",
        ".".join(["a" * 60] * 5),
        "api.example.com\n",
    ],
)
def test_invalid_host(raw: str) -> None:
    assert reason_of(decide_target(POLICY, raw, 443)) is Reason.INVALID_HOST
    assert reason_of(decide_target(OPEN_WEB, raw, 443)) is Reason.INVALID_HOST


@pytest.mark.parametrize("port", [80, 8443, 0, 1, 444, 442, 3128, 65535])
def test_port_other_than_443(port: int) -> None:
    assert reason_of(decide_target(POLICY, HOST, port)) is Reason.PORT_NOT_ALLOWED
    assert reason_of(decide_target(OPEN_WEB, HOST, port)) is Reason.PORT_NOT_ALLOWED


def test_ip_literal_is_refused_before_the_port() -> None:
    assert reason_of(decide_target(POLICY, "127.0.0.1", 80)) is Reason.IP_LITERAL


@pytest.mark.parametrize(
    "raw",
    [
        "example.com",
        "x.api.example.com",
        "api.example.com.evil.net",
        "api.example.co",
        "api-example.com",
        "apiexample.com",
        "example.com.api",
        "bucher.example",
        "xn--bcher-kva.example.org",
    ],
)
def test_host_not_in_policy(raw: str) -> None:
    result = decide_target(POLICY, raw, 443)
    assert reason_of(result) is Reason.HOST_NOT_ALLOWED
    assert isinstance(result, Decision)
    assert "test@2" in result.detail


@pytest.mark.parametrize(
    "raw", ["example.com", "en.wikipedia.org", "a.b", "xn--bcher-kva.example", "bücher.de"]
)
def test_open_web_allows_any_valid_name(raw: str) -> None:
    result = target(raw, OPEN_WEB)
    assert result.rules == (OPEN_WEB.open_web,)


# --- decide_addresses -------------------------------------------------------------------------------------

PUBLIC_V4 = ip("93.184.216.34")
PUBLIC_V6 = ip("2606:2800:220:1:248:1893:25c8:1946")


def test_public_addresses_are_allowed() -> None:
    decision = decide_addresses(HOST, [PUBLIC_V4, PUBLIC_V6], [])
    assert decision.allowed
    assert decision.reason is None


def test_no_addresses_is_a_dns_failure() -> None:
    decision = decide_addresses(HOST, [], [])
    assert decision.reason is Reason.DNS_FAILURE
    assert decision.reason.status == 502


@pytest.mark.parametrize(
    "bad",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "192.0.2.1",
        "::1",
        "::",
        "fd00:ec2::254",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
        "2002:7f00:1::",
    ],
)
@pytest.mark.parametrize("position", [0, 1, 2])
def test_any_forbidden_address_among_several_refuses(bad: str, position: int) -> None:
    addresses = [PUBLIC_V4, PUBLIC_V6]
    addresses.insert(position, ip(bad))
    decision = decide_addresses(HOST, addresses, [])
    assert decision.reason is Reason.FORBIDDEN_ADDRESS
    assert bad in decision.detail or str(ip(bad)) in decision.detail


def test_allow_cidrs_open_a_forbidden_range() -> None:
    addresses = [ip("127.0.0.10"), PUBLIC_V4]
    assert decide_addresses(HOST, addresses, [net("127.0.0.10/32")]).allowed
    assert decide_addresses(HOST, addresses, [net("127.0.0.0/24")]).allowed
    refused = decide_addresses(HOST, [*addresses, ip("127.0.1.1")], [net("127.0.0.0/24")])
    assert refused.reason is Reason.FORBIDDEN_ADDRESS
    assert decide_addresses(HOST, addresses, [net("::1/128")]).reason is Reason.FORBIDDEN_ADDRESS


@pytest.mark.parametrize(
    ("listen", "addr"),
    [
        ("127.0.0.10", "127.0.0.10"),
        ("0.0.0.0", "127.0.0.10"),
        ("0.0.0.0", "93.184.216.34"),
        ("::", "127.0.0.10"),
        ("::1", "::1"),
        ("127.0.0.10", "::ffff:127.0.0.10"),  # an IPv4-mapped address reaches the IPv4 listener
        ("::ffff:127.0.0.10", "127.0.0.10"),
    ],
)
def test_own_endpoint_on_443_is_forbidden(listen: str, addr: str) -> None:
    opened = [net("127.0.0.0/8"), net("::1/128"), net("93.184.216.0/24")]
    decision = decide_addresses(HOST, [ip(addr)], opened, [(ip(listen), 443)])
    assert decision.reason is Reason.FORBIDDEN_ADDRESS
    assert "egressd itself" in decision.detail


@pytest.mark.parametrize(
    ("listen", "port", "addr"),
    [
        ("127.0.0.10", 3128, "127.0.0.10"),  # egressd only ever connects to 443
        ("0.0.0.0", 3128, "127.0.0.10"),
        ("127.0.0.11", 443, "127.0.0.10"),
    ],
)
def test_other_listeners_are_not_own_endpoints(listen: str, port: int, addr: str) -> None:
    decision = decide_addresses(HOST, [ip(addr)], [net("127.0.0.0/8")], [(ip(listen), port)])
    assert decision.allowed


# --- decide_request ---------------------------------------------------------------------------------------


def request(method: str = "GET", path: str = "/v1/items", host: str = HOST, **kwargs: object) -> Decision:
    return decide_request(target(host), facts(method, path, host=host, **kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/items"),
        ("POST", "/v1/items"),
        ("GET", "/v1/items/42"),
        ("GET", "/v1/items?page=2"),
        ("GET", "/v1/items/42?x=/../y"),  # the query is not a path
        ("DELETE", "/v1/items/42"),
        ("GET", "/repos"),
        ("GET", "/repos/a/b/c"),
        ("POST", "/bot123:abc/send"),
        ("GET", "/v1/items/%41"),
        ("GET", "/v1/items/..."),  # three dots are a name, not a dot-segment
        ("GET", "/v1/items/.hidden"),
    ],
)
def test_allowed_requests(method: str, path: str) -> None:
    assert request(method, path).allowed


def test_http2_request_with_authority_only() -> None:
    assert request(authority=HOST, host_headers=()).allowed
    assert request(authority=f"{HOST}:443", host_headers=()).allowed


@pytest.mark.parametrize(
    "sni", [None, "", "example.com", "x.api.example.com", "127.0.0.1", "stream.example.com"]
)
def test_sni_absent_or_other(sni: str | None) -> None:
    decision = decide_request(target(), facts(sni=sni if sni else None))
    assert decision.reason is Reason.SNI_MISMATCH


def test_sni_is_compared_canonically() -> None:
    assert decide_request(target(), facts(sni="API.EXAMPLE.COM.")).allowed
    idn = facts(host="xn--bcher-kva.example", sni="bücher.example")
    assert decide_request(target("bücher.example"), idn).allowed


@pytest.mark.parametrize(
    "name", [HOST, "API.EXAMPLE.COM", f"{HOST}:443", f"{HOST.upper()}:443", f"{HOST}.", f"{HOST}.:443"]
)
def test_host_names_accepted(name: str) -> None:
    assert request(host_headers=(name,)).allowed
    assert request(authority=name, host_headers=()).allowed
    assert request(authority=name).allowed


@pytest.mark.parametrize(
    "name",
    [
        "example.com",
        f"{HOST}:8443",
        f"{HOST}:80",
        f"{HOST}:0443",
        f"{HOST}:",
        f"{HOST}:443:443",
        f"x.{HOST}",
        f"{HOST}..",
        "127.0.0.1",
        "127.0.0.1:443",
        "[::1]:443",
        f"user@{HOST}",
        f"{HOST}@evil.com",
        f"{HOST} ",
    ],
)
def test_host_mismatch(name: str) -> None:
    assert request(host_headers=(name,)).reason is Reason.HOST_MISMATCH
    assert request(authority=name, host_headers=()).reason is Reason.HOST_MISMATCH
    assert request(authority=name).reason is Reason.HOST_MISMATCH
    assert request(authority=HOST, host_headers=(name,)).reason is Reason.HOST_MISMATCH


def test_request_naming_no_host_is_bad() -> None:
    assert request(host_headers=()).reason is Reason.BAD_REQUEST


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/items"),
        ("HEAD", "/v1/items"),
        ("get", "/v1/items"),
        ("PATCH", "/repos/x"),
        ("OPTIONS", "/"),
    ],
)
def test_method_not_allowed(method: str, path: str) -> None:
    assert request(method, path).reason is Reason.METHOD_NOT_ALLOWED


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/v1"),
        ("GET", "/v1/items/42/parts"),
        ("GET", "/v1/items2"),
        ("GET", "/reposx"),
        ("DELETE", "/v1/items"),  # DELETE's rule has a narrower path list than GET's
        ("POST", "/bot1/x/send"),
        ("GET", "/V1/items"),
        ("GET", "/v1/item%73"),  # no decoding into a match
    ],
)
def test_path_not_allowed(method: str, path: str) -> None:
    assert request(method, path).reason is Reason.PATH_NOT_ALLOWED


@pytest.mark.parametrize(
    "path",
    [
        "/repos/../admin",
        "/repos/./x",
        "/repos/..",
        "/repos/.",
        "/..",
        "/.",
        "/repos/%2e%2e/admin",
        "/repos/%2E%2e/admin",
        "/repos/%2e./admin",
        "/repos/.%2E/admin",
        "/repos/%2e/admin",
        "/repos/%252e%252e/admin",
        "/repos/%252E/admin",
        "/repos/%25252e%25252e/admin",
        "/repos/%2e%2e?x=1",
        "/repos\\..\\admin",
        "/repos/%5c../admin",
        "/repos/%2f../admin",
        "/repos/..%2fadmin",
        "/repos/..%252fadmin",  # '/' to a server that decodes twice
        "/repos/x%255c..",
        "/repos/..;/admin",  # '..' to servers that drop ';parameters'
        "/repos/.;x/admin",
        "/repos/%c0%ae%c0%ae/admin",  # overlong UTF-8 '.'
        "/repos/%ff/admin",
        "*",
        "",
        "repos/x",
    ],
)
def test_invalid_path(path: str) -> None:
    assert request("GET", path).reason is Reason.INVALID_PATH


def test_dot_segments_are_refused_even_for_any_path_rules() -> None:
    decision = decide_request(target("bücher.example"), facts(path="/a/../b", host="xn--bcher-kva.example"))
    assert decision.reason is Reason.INVALID_PATH
    assert decide_request(target("bücher.example"), facts(path="/a//b", host="xn--bcher-kva.example")).allowed


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"method": "CONNECT", "path": "/v1/items"}, "CONNECT"),
        ({"content_lengths": ("5", "5")}, "more than one Content-Length"),
        ({"content_lengths": ("5", "6")}, "more than one Content-Length"),
        ({"content_lengths": ("5, 5",)}, "not a number"),
        ({"content_lengths": ("-1",)}, "not a number"),
        ({"content_lengths": ("",)}, "not a number"),
        ({"content_lengths": ("5",), "transfer_encoding": True}, "both Content-Length and Transfer-Encoding"),
        ({"upgrade": "h2c"}, "h2c"),
        ({"upgrade": "H2C"}, "h2c"),
        ({"upgrade": "websocket, h2c"}, "h2c"),
        ({"http2_settings": True}, "h2c"),
        ({"upgrade": "TLS/1.2"}, "upgrade"),
        ({"host_headers": (HOST, HOST)}, "more than one Host"),
        ({"host_headers": (HOST, "evil.com")}, "more than one Host"),
    ],
)
def test_ambiguous_framing_is_a_bad_request(kwargs: dict[str, object], why: str) -> None:
    method = str(kwargs.pop("method", "POST"))
    path = str(kwargs.pop("path", "/v1/items"))
    decision = request(method, path, **kwargs)
    assert decision.reason is Reason.BAD_REQUEST
    assert decision.reason.status == 400
    assert why in decision.detail


def test_plain_content_length_and_chunked_bodies_are_fine() -> None:
    assert request("POST", content_lengths=("12",)).allowed
    assert request("POST", transfer_encoding=True).allowed


@pytest.mark.parametrize("upgrade", ["websocket", "WebSocket", "websocket/13"])
def test_websocket_upgrade_needs_the_rule(upgrade: str) -> None:
    refused = request("GET", "/v1/items", upgrade=upgrade)
    assert refused.reason is Reason.WEBSOCKET_NOT_ALLOWED
    stream = "stream.example.com"
    assert request("GET", "/ws", host=stream, upgrade=upgrade).allowed


def test_websocket_rule_still_checks_method_and_path() -> None:
    stream = "stream.example.com"
    assert request("GET", "/other", host=stream, upgrade="websocket").reason is Reason.PATH_NOT_ALLOWED
    assert request("POST", "/ws", host=stream, upgrade="websocket").reason is Reason.METHOD_NOT_ALLOWED


def test_open_web_request_rules() -> None:
    tunnel = target("en.wikipedia.org", OPEN_WEB)
    ok = facts("GET", "/wiki/Coffee", host="en.wikipedia.org")
    assert decide_request(tunnel, ok).allowed
    post = facts("POST", "/wiki/Coffee", host="en.wikipedia.org")
    assert decide_request(tunnel, post).reason is Reason.METHOD_NOT_ALLOWED
    ws = facts("GET", "/", host="en.wikipedia.org", upgrade="websocket")
    assert decide_request(tunnel, ws).reason is Reason.WEBSOCKET_NOT_ALLOWED


# --- properties -------------------------------------------------------------------------------------------

_LABEL = st.from_regex(r"\A[a-z0-9](?:[a-z0-9-]{0,14}[a-z0-9])?\Z").filter(lambda s: "--" not in s[2:4])
_TLD = st.from_regex(r"\A[a-z][a-z0-9]{1,5}\Z")
_NAME = st.builds(
    lambda labels, tld: ".".join([*labels, tld]), st.lists(_LABEL, min_size=1, max_size=3), _TLD
)


def _policy_with(hosts: list[str]) -> Policy:
    rules = "".join(f'[[allow]]\nhost = "{host}"\nreason = "Needed"\n' for host in hosts)
    return parse_policy(f'name = "prop"\nversion = 1\n{rules}', "prop.toml")


def _canonical(raw: str) -> str | None:
    try:
        return normalize_host(raw)
    except HostError:
        return None


@st.composite
def _candidate(draw: st.DrawFn, hosts: list[str]) -> str:
    """A host name near the policy's (a mutation of one of them) or anywhere else."""
    base = draw(st.sampled_from(hosts))
    return draw(
        st.one_of(
            _NAME,
            st.builds(lambda label: f"{label}.{base}", _LABEL),
            st.builds(lambda label: f"{base}.{label}", _LABEL),
            st.builds(lambda label: f"{label}{base}", _LABEL),
            st.builds(lambda label: f"{base}{label}", _LABEL),
            st.just(base.partition(".")[2]),
            st.just(base.replace(".", "-", 1)),
            st.just(base[:-1]),
            st.builds(
                lambda i, c: base[:i] + c + base[i + 1 :],
                st.integers(0, len(base) - 1),
                st.sampled_from(string.ascii_letters + string.digits + "-.ü"),
            ),
            st.text(alphabet=string.ascii_letters + string.digits + "-._:[]*/@%ü", min_size=0, max_size=40),
        )
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hosts=st.lists(_NAME, min_size=1, max_size=6, unique=True))
def test_no_host_outside_the_policy_is_ever_allowed(data: st.DataObject, hosts: list[str]) -> None:
    policy = _policy_with(hosts)
    allowed = {rule.host for rule in policy.allow}
    for host in hosts:
        assert isinstance(decide_target(policy, host, 443), Target)
    candidate = data.draw(_candidate(hosts))
    if _canonical(candidate) in allowed:
        return  # a spelling of an allowed name (case, trailing dot), not a host outside the policy
    result = decide_target(policy, candidate, 443)
    assert isinstance(result, Decision), f"{candidate!r} was allowed by {sorted(allowed)}"
    assert not result.allowed
    assert result.reason in {Reason.HOST_NOT_ALLOWED, Reason.INVALID_HOST, Reason.IP_LITERAL}


_SEGMENT = st.text(alphabet=string.ascii_letters + string.digits + "-_~.%:@!$&'()*+,;=", max_size=8)
_DOT = st.sampled_from(
    [".", "..", "%2e", "%2E", "%2e%2e", ".%2e", "%2E.", "%2E%2e", "%252e", "%252E%252e", "%25252e"]
)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(_SEGMENT, max_size=4),
    dot=_DOT,
    after=st.lists(_SEGMENT, max_size=4),
    query=st.one_of(st.just(""), st.text(alphabet=string.printable, max_size=12).map(lambda q: "?" + q)),
    method=st.sampled_from(["GET", "POST", "DELETE", "HEAD"]),
)
def test_no_path_with_a_dot_segment_ever_passes(
    before: list[str], dot: str, after: list[str], query: str, method: str
) -> None:
    path = "/" + "/".join([*before, dot, *after]) + query
    for host in (HOST, "bücher.example"):
        tunnel = target(host)
        decision = decide_request(tunnel, facts(method, path, host=tunnel.host, sni=host))
        assert not decision.allowed, path
    tunnel = target("bücher.example")
    decision = decide_request(tunnel, facts(method, path, host=tunnel.host, sni="bücher.example"))
    assert decision.reason is Reason.INVALID_PATH
