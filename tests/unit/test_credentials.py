"""Reading the run's token out of Proxy-Authorization: Basic with any user name, or Bearer."""

import base64

import pytest

from egressd.credentials import token_from_header

TOKEN = "Abc_def-0123456789xyzXYZ_-abcdefghijklmnop"  # the shape of secrets.token_urlsafe(32)


def basic(userpass: str | bytes) -> str:
    raw = userpass.encode() if isinstance(userpass, str) else userpass
    return "Basic " + base64.b64encode(raw).decode("ascii")


@pytest.mark.parametrize("user", ["egressd", "", "x", "any user", "ü-user", "user@example.com"])
def test_basic_with_any_user(user: str) -> None:
    assert token_from_header(basic(f"{user}:{TOKEN}")) == TOKEN


@pytest.mark.parametrize("scheme", ["Basic", "basic", "BASIC", "bAsIc"])
def test_basic_scheme_is_case_insensitive(scheme: str) -> None:
    value = basic(f"egressd:{TOKEN}").replace("Basic", scheme, 1)
    assert token_from_header(value) == TOKEN


@pytest.mark.parametrize("value", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"  Bearer   {TOKEN}  "])
def test_bearer(value: str) -> None:
    assert token_from_header(value) == TOKEN


def test_surrounding_whitespace_is_ignored() -> None:
    assert token_from_header("  " + basic(f"u:{TOKEN}").replace(" ", "   ") + " ") == TOKEN


@pytest.mark.parametrize("value", [None, "", "   "])
def test_absent(value: str | None) -> None:
    assert token_from_header(value) is None


@pytest.mark.parametrize(
    "value",
    [
        "Basic",
        "Basic ",
        "Basic !!!!",
        "Basic " + base64.b64encode(f"u:{TOKEN}".encode()).decode()[:-1],  # bad padding
        "Basic " + base64.b64encode(f"u:{TOKEN}".encode()).decode() + "=",
        "Basic " + base64.urlsafe_b64encode(f"u?:{TOKEN}>>>".encode()).decode(),  # '-' and '_' are not base64
        "Basic dXNlcjp0b2tlbg== extra",
        "Basic " + "\u00e9" * 8,  # non-ASCII in the header value
        "Basic \udcff\udcfe",  # undecodable bytes as mitmproxy hands them over
    ],
)
def test_malformed_base64(value: str) -> None:
    assert token_from_header(value) is None


def test_basic_payload_that_is_not_utf8() -> None:
    assert token_from_header(basic(b"u:" + b"\xff" * 20)) is None


@pytest.mark.parametrize("payload", [TOKEN, f"egressd{TOKEN}", ""])
def test_basic_without_colon(payload: str) -> None:
    assert token_from_header(basic(payload)) is None


def test_only_the_first_colon_separates_the_user() -> None:
    assert token_from_header(basic(f"user:{TOKEN}:more")) is None
    assert token_from_header(basic(f":{TOKEN}")) == TOKEN


@pytest.mark.parametrize(
    "token",
    [
        TOKEN + "+",
        TOKEN + "/",
        TOKEN + "=",
        TOKEN[:20] + " " + TOKEN[20:],
        TOKEN + ".",
        TOKEN + "ü",
        TOKEN + "\x00",
        TOKEN + "%41",
    ],
)
def test_bad_charset(token: str) -> None:
    assert token_from_header(basic(f"u:{token}")) is None
    assert token_from_header(f"Bearer {token}") is None


@pytest.mark.parametrize("length", [0, 1, 15])
def test_too_short(length: int) -> None:
    token = TOKEN[:length]
    assert token_from_header(basic(f"u:{token}")) is None
    assert token_from_header(f"Bearer {token}") is None


@pytest.mark.parametrize(("length", "ok"), [(16, True), (128, True), (129, False), (1000, False)])
def test_length_bounds(length: int, ok: bool) -> None:
    token = ("a" * length)[:length]
    expected = token if ok else None
    assert token_from_header(basic(f"u:{token}")) == expected
    assert token_from_header(f"Bearer {token}") == expected


@pytest.mark.parametrize(
    "value",
    [
        f"Digest {TOKEN}",
        f"Token {TOKEN}",
        TOKEN,
        f"Bearer{TOKEN}",
        f"Basic{base64.b64encode(f'u:{TOKEN}'.encode()).decode()}",
        f"Negotiate {TOKEN}",
    ],
)
def test_other_schemes(value: str) -> None:
    assert token_from_header(value) is None
