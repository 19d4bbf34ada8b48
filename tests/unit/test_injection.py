"""Placeholder substitution without a proxy: where a placeholder may go, and what happens when it may not."""

import base64

import pytest

from egressd.injection import PLACEHOLDER_SHAPE, Injected, RunSecrets, inject, new_placeholder
from egressd.policy import SecretBinding
from egressd.reasons import Decision

TOKEN, KEY = new_placeholder(), new_placeholder()
SECRETS = RunSecrets(
    names={TOKEN: "TOKEN", KEY: "KEY"},
    values={"TOKEN": "tok-value-123", "KEY": "key/value?&="},
    bindings={
        "TOKEN": SecretBinding(name="TOKEN", hosts=("api.test",)),
        "KEY": SecretBinding(name="KEY", hosts=("api.test",), where=("header:x-key", "query")),
    },
)


def run(headers: list[tuple[str, str]], path: str = "/", query: str = "", host: str = "api.test") -> Injected:
    result = inject(SECRETS, host, headers, path, query)
    assert isinstance(result, Injected), result
    return result


def refused(headers: list[tuple[str, str]], path: str = "/", query: str = "", host: str = "api.test") -> str:
    result = inject(SECRETS, host, headers, path, query)
    assert isinstance(result, Decision) and result.reason is not None
    assert "tok-value" not in result.detail and "key/value" not in result.detail
    return result.reason.value


def test_placeholders_have_the_promised_shape() -> None:
    placeholder = new_placeholder()
    assert placeholder.startswith("egressd_ph_") and len(placeholder) == len("egressd_ph_") + 32
    assert PLACEHOLDER_SHAPE.fullmatch(placeholder)
    assert new_placeholder() != placeholder


def test_headers_path_and_query() -> None:
    result = run([("Authorization", f"Bearer {TOKEN}"), ("X-Key", KEY), ("Accept", "*/*")],
                 path=f"/a/{TOKEN}", query=f"k={KEY}&t={TOKEN}")
    assert result.headers == [("Authorization", "Bearer tok-value-123"), ("X-Key", "key/value?&="),
                              ("Accept", "*/*")]
    assert result.path == "/a/tok-value-123"
    assert result.query == "k=key%2Fvalue%3F%26%3D&t=tok-value-123"  # percent-encoded: the query stays a query
    assert result.names == {"TOKEN", "KEY"}


def test_basic_credentials() -> None:
    encoded = base64.b64encode(f"bot:{TOKEN}".encode()).decode()
    result = run([("Authorization", f"Basic {encoded}")])
    assert base64.b64decode(result.headers[0][1].split()[1]) == b"bot:tok-value-123"
    assert result.names == {"TOKEN"}


def test_nothing_to_do() -> None:
    result = run([("Accept", "*/*")], path="/x", query="a=1")
    assert result.names == set() and result.headers == [("Accept", "*/*")]


@pytest.mark.parametrize(("headers", "path", "query", "host"), [
    ([("Authorization", f"Bearer {TOKEN}")], "/", "", "other.test"),  # another host
    ([("Authorization", KEY)], "/", "", "api.test"),  # a header outside `where`
    ([], f"/{KEY}", "", "api.test"),  # the path, outside `where`
    ([("Authorization", "Basic " + base64.b64encode(f"u:{KEY}".encode()).decode())], "/", "", "api.test"),
])
def test_secret_not_allowed(headers: list[tuple[str, str]], path: str, query: str, host: str) -> None:
    assert refused(headers, path, query, host) == "secret_not_allowed"


@pytest.mark.parametrize("stranger", [new_placeholder(), "egressd_ph_madeup", f"{TOKEN}_suffix"])
def test_secret_unknown(stranger: str) -> None:
    assert refused([("X-Any", stranger)]) == "secret_unknown"
    assert refused([], query=f"q={stranger}") == "secret_unknown"
