"""Policy files: parsing, refusals naming the file, the field and why, path patterns and canonical hashing."""

from pathlib import Path

import pytest

from egressd.policy import PathPattern, Policy, PolicyError, parse_policy

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
SOURCE = "policies/test-v1.toml"

MINIMAL = """
name = "test"
version = 1

[[allow]]
host = "api.example.com"
reason = "Talk to the API"
"""


def policy_text(*, header: str = 'name = "test"\nversion = 1\n', rules: str = "") -> str:
    return header + "\n" + rules


def rule(host: str = '"api.example.com"', extra: str = "", reason: str = '"Talk to the API"') -> str:
    return f"[[allow]]\nhost = {host}\nreason = {reason}\n{extra}\n"


def refusal(text: str, source: str = SOURCE) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source)
    return str(info.value)


# --- the example policies ---------------------------------------------------------------------------------


def test_example_policies_exist() -> None:
    assert len(sorted(POLICIES_DIR.glob("*.toml"))) >= 2


@pytest.mark.parametrize("path", sorted(POLICIES_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_example_policy_parses(path: Path) -> None:
    policy = parse_policy(path.read_text(encoding="utf-8"), str(path))
    assert policy.name
    assert policy.version >= 1
    assert len(policy.sha256) == 64
    for allow in policy.allow:
        assert allow.reason
        assert allow.host == allow.host.lower()


def test_roastery_example_matches_the_spec() -> None:
    policy = parse_policy((POLICIES_DIR / "roastery-bot-v3.toml").read_text(encoding="utf-8"), "roastery")
    assert policy.key == ("roastery-bot", 3)
    assert policy.label == "roastery-bot@3"
    (telegram,) = policy.rules_for("api.telegram.org")
    assert telegram.methods == ("POST",)
    assert telegram.allows_path("/bot123:abc/sendMessage")
    assert not telegram.allows_path("/bot123/getUpdates")
    assert policy.rules_for("example.com") == ()


def test_minimal_policy() -> None:
    policy = parse_policy(MINIMAL, SOURCE)
    assert policy.description == ""
    assert policy.open_web is None
    (allow,) = policy.allow
    assert allow.host == "api.example.com"
    assert allow.methods is None
    assert allow.paths is None
    assert allow.websocket is False
    assert allow.allows_method("DELETE")
    assert allow.allows_path("/anything/at/all")


# --- hosts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("1.2.3.4", "IP address"),
        ("127.1", "IP address"),
        ("2130706433", "IP address"),
        ("0x7f000001", "IP address"),
        ("::1", "IP address"),
        ("[2001:db8::1]", "IP address"),
        ("*.example.com", "wildcard"),
        ("api.*.com", "wildcard"),
        ("api.example.com:443", "port"),
        ("https://api.example.com", "scheme"),
        ("http://api.example.com/", "scheme"),
        ("localhost", "single label"),
        ("api..example.com", "empty label"),
        ("-api.example.com", "hyphen"),
        ("api_x.example.com", "letters, digits and hyphens"),
        ("api example.com", "whitespace"),
        ("api.example.com/path", "path"),
        ("user@api.example.com", "user info"),
        ("", "empty"),
        ("a" * 64 + ".example.com", "longer than 63"),
    ],
)
def test_bad_host_is_refused_with_file_field_and_why(host: str, why: str) -> None:
    text = policy_text(rules=rule(f'"{host}"'))
    message = refusal(text)
    assert message.startswith(f"{SOURCE}: allow[0].host: ")
    assert why in message
    assert len(message.splitlines()) == 1


def test_bad_host_in_a_later_rule_names_its_index() -> None:
    text = policy_text(rules=rule() + rule('"10.0.0.1"'))
    message = refusal(text)
    assert message.startswith(f"{SOURCE}: allow[1].host: ")
    assert "IP address" in message


def test_non_string_host_is_refused() -> None:
    message = refusal(policy_text(rules=rule("443")))
    assert "allow[0].host" in message


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("API.Example.COM", "api.example.com"),
        ("api.example.com.", "api.example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ],
)
def test_host_is_stored_lower_case_ascii(raw: str, stored: str) -> None:
    policy = parse_policy(policy_text(rules=rule(f'"{raw}"')), SOURCE)
    assert policy.allow[0].host == stored
    assert policy.rules_for(stored) == (policy.allow[0],)


def test_idn_spellings_hash_the_same() -> None:
    unicode = parse_policy(policy_text(rules=rule('"bücher.example"')), SOURCE)
    a_label = parse_policy(policy_text(rules=rule('"xn--bcher-kva.example"')), SOURCE)
    assert unicode.sha256 == a_label.sha256


# --- reasons, unknown keys, names, versions ------------------------------------------------------------


def test_missing_reason_is_required() -> None:
    text = policy_text(rules='[[allow]]\nhost = "api.example.com"\n')
    message = refusal(text)
    assert message == f"{SOURCE}: allow[0].reason (host 'api.example.com'): required"


@pytest.mark.parametrize("reason", ['""', '"   "', '"\\t\\n"'])
def test_empty_reason_is_refused(reason: str) -> None:
    message = refusal(policy_text(rules=rule(reason=reason)))
    assert message.startswith(f"{SOURCE}: allow[0].reason (host 'api.example.com'): ")


def test_reason_is_stripped() -> None:
    policy = parse_policy(policy_text(rules=rule(reason='"  Talk to the API  "')), SOURCE)
    assert policy.allow[0].reason == "Talk to the API"


def test_open_web_needs_a_reason() -> None:
    message = refusal(policy_text(rules='[open_web]\nmethods = ["GET"]\n'))
    assert message == f"{SOURCE}: open_web.reason: required"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (MINIMAL + "colour = 'blue'\n", "allow[0].colour (host 'api.example.com')"),
        ('owner = "me"\n' + MINIMAL, "owner"),
        (MINIMAL + '[open_web]\nreason = "r"\nhosts = ["x.com"]\n', "open_web.hosts"),
        (MINIMAL.replace("[[allow]]", "[[allows]]"), "allows"),
    ],
)
def test_unknown_keys_are_refused(text: str, where: str) -> None:
    assert f"{SOURCE}: {where}: unknown key" in refusal(text)


@pytest.mark.parametrize(
    "name", ["Test", "-test", "test_bot", "test bot", "", "a" * 64, "tést", "test.v1", 7]
)
def test_bad_name_is_refused(name: object) -> None:
    value = f'"{name}"' if isinstance(name, str) else str(name)
    text = MINIMAL.replace('name = "test"', f"name = {value}")
    assert refusal(text).startswith(f"{SOURCE}: name: ")


@pytest.mark.parametrize("name", ["a", "0", "roastery-bot", "a-", "a" * 63, "9to5"])
def test_good_names(name: str) -> None:
    assert parse_policy(MINIMAL.replace('name = "test"', f'name = "{name}"'), SOURCE).name == name


@pytest.mark.parametrize("version", ["0", "-1", '"3"', "1.0", "1.5", "true", "[1]"])
def test_version_must_be_a_positive_integer(version: str) -> None:
    text = MINIMAL.replace("version = 1", f"version = {version}")
    assert refusal(text).startswith(f"{SOURCE}: version: ")


def test_missing_name_and_version_are_both_reported() -> None:
    message = refusal('[[allow]]\nhost = "a.example"\nreason = "r"\n')
    assert f"{SOURCE}: name: required" in message.splitlines()
    assert f"{SOURCE}: version: required" in message.splitlines()


def test_policy_that_allows_nothing_is_refused() -> None:
    assert "allows nothing" in refusal('name = "test"\nversion = 1\n')


def test_bad_toml_names_the_file() -> None:
    assert refusal('name = "test\n').startswith(f"{SOURCE}: not valid TOML")


def test_every_problem_is_reported_on_its_own_line() -> None:
    text = policy_text(rules=rule('"1.2.3.4"') + rule('"*.x.com"') + rule(extra="bogus = 1"))
    lines = refusal(text).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "allow[0].host",
        "allow[1].host",
        "allow[2].bogus (host 'api.example.com')",
    ]
    assert all(line.startswith(f"{SOURCE}: ") for line in lines)


# --- methods and paths -------------------------------------------------------------------------------------


def test_methods_are_upper_cased_and_deduplicated() -> None:
    policy = parse_policy(policy_text(rules=rule(extra='methods = ["get", "Post", "GET"]')), SOURCE)
    assert policy.allow[0].methods == ("GET", "POST")
    assert policy.allow[0].allows_method("GET")
    assert policy.allow[0].allows_method("POST")
    assert not policy.allow[0].allows_method("PUT")


@pytest.mark.parametrize("methods", ["[]", '["GET POST"]', '["GET/1"]', '[""]', "[1]", '"GET"'])
def test_bad_methods_are_refused(methods: str) -> None:
    message = refusal(policy_text(rules=rule(extra=f"methods = {methods}")))
    assert message.startswith(f"{SOURCE}: allow[0].methods")


@pytest.mark.parametrize(
    "paths",
    [
        "[]",
        '["no-slash"]',
        '["/a?x=1"]',
        '["/a#frag"]',
        '["/a/../b"]',
        '["/a/./b"]',
        '["/**/x"]',
        '["/a**"]',
        '["/a b"]',
        "[7]",
    ],
)
def test_bad_paths_are_refused(paths: str) -> None:
    message = refusal(policy_text(rules=rule(extra=f"paths = {paths}")))
    assert message.startswith(f"{SOURCE}: allow[0].paths")


def test_websocket_must_be_a_boolean() -> None:
    message = refusal(policy_text(rules=rule(extra='websocket = "yes"')))
    assert message.startswith(f"{SOURCE}: allow[0].websocket")


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("/v1/forecast", "/v1/forecast", True),
        ("/v1/forecast", "/v1/forecast/", False),
        ("/v1/forecast", "/v1/forecasts", False),
        ("/v1/forecast", "/V1/forecast", False),
        ("/bot*/sendMessage", "/bot123:abc/sendMessage", True),
        ("/bot*/sendMessage", "/bot/sendMessage", True),
        ("/bot*/sendMessage", "/bot1/x/sendMessage", False),
        ("/bot*/sendMessage", "/xbot1/sendMessage", False),
        ("/*/b", "/a/b", True),
        ("/*/b", "//b", True),
        ("/*/b", "/a/a/b", False),
        ("/a/*", "/a/", True),
        ("/a/*", "/a/x/y", False),
        ("/repos/**", "/repos", True),
        ("/repos/**", "/repos/", True),
        ("/repos/**", "/repos/o/r/pulls", True),
        ("/repos/**", "/repository", False),
        ("/repos/**", "/reposx/y", False),
        ("/repos/**", "/other/repos/x", False),
        ("/**", "/", True),
        ("/**", "/any/thing", True),
        ("/a/*/**", "/a/b", True),
        ("/a/*/**", "/a/b/c/d", True),
        ("/a/*/**", "/a", False),
        ("/a.b", "/axb", False),  # regex characters in patterns are literal
        ("/a+", "/aa", False),
        ("/a(b)", "/a(b)", True),
        ("/v1/forecast", "/v1/forecast?lat=1", False),  # the caller strips the query
    ],
)
def test_path_pattern_semantics(pattern: str, path: str, matches: bool) -> None:
    assert PathPattern(pattern).matches(path) is matches


def test_rule_matches_paths_without_query() -> None:
    policy = parse_policy(policy_text(rules=rule(extra='paths = ["/v1/forecast", "/repos/**"]')), SOURCE)
    allow = policy.allow[0]
    assert allow.allows_path("/v1/forecast")
    assert allow.allows_path("/repos/a/b")
    assert not allow.allows_path("/v1/forecast?x=1")
    assert not allow.allows_path("/v2/forecast")


def test_query_like_text_cannot_be_a_pattern() -> None:
    assert "is not a path pattern" in refusal(policy_text(rules=rule(extra='paths = ["/search?q=*"]')))


# --- rules by host --------------------------------------------------------------------------------


def test_rules_for_prefers_allow_rules_over_open_web() -> None:
    text = policy_text(
        rules=rule(extra='methods = ["POST"]')
        + rule(extra='methods = ["GET"]')
        + '[open_web]\nreason = "Read the web"\nmethods = ["GET", "HEAD"]\n'
    )
    policy = parse_policy(text, SOURCE)
    assert policy.rules_for("api.example.com") == policy.allow
    assert policy.rules_for("other.example.org") == (policy.open_web,)


# --- canonical hashing ------------------------------------------------------------------------------------

CANONICAL = """
name = "roastery-bot"
version = 3
description = "Posts the daily roast report"

[[allow]]
host = "api.telegram.org"
reason = "Send the report"
methods = ["POST"]
paths = ["/bot*/sendMessage"]

[[allow]]
host = "api.open-meteo.com"
reason = "Read the forecast"
methods = ["GET", "HEAD"]
"""

REFORMATTED = """
# The same policy, written differently.
description   =   'Posts the daily roast report'   # literal string
version = 3
name = "roastery-bot"

[[allow]]
reason = "Send the report"
paths = ['/bot*/sendMessage']
host = "API.Telegram.org."      # case and one trailing dot do not matter
methods = [
  "post",
]

[[allow]]
methods = ["head", "GET", "get"]
host = "api.open-meteo.com"
reason = "  Read the forecast "
"""

INLINE = """
name = "roastery-bot"
version = 3
description = "Posts the daily roast report"
allow = [
  { host = "api.telegram.org", reason = "Send the report", methods = ["POST"], paths = ["/bot*/sendMessage"] },
  { host = "api.open-meteo.com", reason = "Read the forecast", methods = ["GET", "HEAD"] },
]
"""


def test_sha256_is_stable_across_formatting_comments_and_key_order() -> None:
    first = parse_policy(CANONICAL, "a.toml")
    second = parse_policy(REFORMATTED, "b.toml")
    assert first == second
    assert first.sha256 == second.sha256
    assert first.sha256 == parse_policy(CANONICAL, "c.toml").sha256
    assert first.sha256 == parse_policy(INLINE, "d.toml").sha256


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('methods = ["POST"]', 'methods = ["POST", "PUT"]'),
        ('paths = ["/bot*/sendMessage"]', 'paths = ["/bot*/sendMessage", "/bot*/getMe"]'),
        ('paths = ["/bot*/sendMessage"]', ""),
        ("version = 3", "version = 4"),
        ('name = "roastery-bot"', 'name = "roastery-bots"'),
        ('host = "api.open-meteo.com"', 'host = "api2.open-meteo.com"'),
        ('reason = "Read the forecast"', 'reason = "Read the forecasts"'),
        ('description = "Posts the daily roast report"', 'description = ""'),
        ('methods = ["POST"]', 'methods = ["POST"]\nwebsocket = true'),
    ],
)
def test_sha256_differs_when_content_differs(old: str, new: str) -> None:
    assert old in CANONICAL
    changed = CANONICAL.replace(old, new)
    assert parse_policy(changed, SOURCE).sha256 != parse_policy(CANONICAL, SOURCE).sha256


def test_sha256_differs_with_open_web() -> None:
    plain = parse_policy(CANONICAL, SOURCE)
    wider = parse_policy(CANONICAL + '\n[open_web]\nreason = "Read"\nmethods = ["GET"]\n', SOURCE)
    assert plain.sha256 != wider.sha256


def test_canonical_content_round_trips_through_json() -> None:
    policy = parse_policy(
        CANONICAL + '\n[[allow]]\nhost = "bücher.example"\nreason = "Books"\nwebsocket = true\n'
        '\n[open_web]\nreason = "Read"\nmethods = ["get"]\n',
        SOURCE,
    )
    again = Policy.model_validate_json(policy.model_dump_json())
    assert again == policy
    assert again.sha256 == policy.sha256


def test_policies_are_immutable() -> None:
    policy = parse_policy(MINIMAL, SOURCE)
    with pytest.raises(ValueError, match="frozen"):
        policy.version = 2  # type: ignore[misc]


# --- secret bindings ---------------------------------------------------------------------------------------

SECRET_BASE = 'name = "s"\nversion = 1\n[[allow]]\nhost = "api.github.com"\nreason = "r"\n'


def test_secret_binding_parses_and_normalizes() -> None:
    policy = parse_policy(SECRET_BASE + '[[secret]]\nname = "GITHUB_TOKEN"\nhosts = ["API.GitHub.com."]\n'
                          'where = ["header:Authorization", "query"]\n', "s.toml")
    binding = policy.binding("GITHUB_TOKEN")
    assert binding is not None and binding.hosts == ("api.github.com",)
    assert binding.allows_place("header:authorization") and binding.allows_place("query")
    assert not binding.allows_place("path") and not binding.allows_place("header:x-other")
    star = parse_policy(SECRET_BASE + '[[secret]]\nname = "T"\nhosts = ["api.github.com"]\nwhere = ["header:*"]\n',
                        "s.toml").secret[0]
    assert star.allows_place("header:x-anything") and not star.allows_place("query")


@pytest.mark.parametrize(("secret", "expected"), [
    ('name = "T"\nhosts = ["evil.test"]\n', "secret[0].hosts: T is bound to evil.test, which no [[allow]] rule"),
    ('name = "lower"\nhosts = ["api.github.com"]\n', "secret[0].name"),
    ('name = "T"\nhosts = []\n', "secret[0].hosts"),
    ('name = "T"\nhosts = ["api.github.com"]\nwhere = ["body"]\n', "'body' is not a place"),
    ('name = "T"\nhosts = ["api.github.com"]\nwhere = []\n', "secret[0].where"),
    ('name = "T"\nhosts = ["*.github.com"]\n', "wildcard"),
])
def test_bad_secret_bindings_are_refused(secret: str, expected: str) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(SECRET_BASE + "[[secret]]\n" + secret, "s.toml")
    assert expected in str(refused.value) and "s.toml" in str(refused.value)


def test_a_secret_bound_twice_is_refused() -> None:
    twice = '[[secret]]\nname = "T"\nhosts = ["api.github.com"]\n' * 2
    with pytest.raises(PolicyError, match="bound more than once"):
        parse_policy(SECRET_BASE + twice, "s.toml")
