"""Secrets stay outside: placeholders in the run, values injected only where bound, replies scrubbed.

One daemon of this module's own (port 3130) with two operator secrets and a policy binding three secrets.
The canary values below must never reach the client, the audit log, the daemon's output, CLI output or the
state dir outside the secrets store, in any form."""

import base64
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dns_server import ScriptedDNS
from tests.support.egressd_process import CurlResult, Egressd, rss_kib
from tests.support.upstream import HttpsUpstream
from tests.support.websocket import WebSocketUpstream, websocket_exchange

API_TOKEN = "CANARY-api-token-4f1d9c2b7e"
HEADER_ONLY = "CANARY-header-only-8a3e5d0c"
RUN_TOKEN = "CANARY/run+token=9b7c&x?y"  # characters that need percent-encoding in a path or query
CANARIES = (API_TOKEN, HEADER_ONLY, RUN_TOKEN)

VAULT_POLICY = """
name = "vault"
version = 1

[[allow]]
host = "api.example.test"
reason = "the API the secrets are for"

[[allow]]
host = "www.example.test"
reason = "another allowed host, bound to no secret"

[[allow]]
host = "ws.example.test"
reason = "a WebSocket API that authenticates its handshake"
websocket = true

[[secret]]
name = "API_TOKEN"
hosts = ["api.example.test", "ws.example.test"]

[[secret]]
name = "HEADER_ONLY"
hosts = ["api.example.test"]
where = ["header:x-api-key"]

[[secret]]
name = "RUN_TOKEN"
hosts = ["api.example.test"]
"""


def forms(value: str) -> list[str]:
    raw = value.encode()
    return [value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value),
            base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")]


def assert_no_canary(text: str, where: str) -> None:
    for value in CANARIES:
        for form in forms(value):
            assert form not in text, f"a form of a secret value ({form[:6]}…) is in {where}"


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory, dns: ScriptedDNS, test_ca_pem: Path,
          upstream: HttpsUpstream) -> Iterator[Egressd]:
    root = tmp_path_factory.mktemp("vault")
    files = root / "operator-secrets"
    files.mkdir(mode=0o700)
    for name, value in (("api-token", API_TOKEN), ("header-only", HEADER_ONLY)):
        (files / name).write_text(value + "\n")
        (files / name).chmod(0o600)
    extra = (f'[secrets.API_TOKEN]\nfile = "{files / "api-token"}"\n'
             f'[secrets.HEADER_ONLY]\nfile = "{files / "header-only"}"\n')
    daemon = Egressd(root, dns.server_spec, test_ca_pem, listen="127.0.0.1:3130", metrics="127.0.0.1:9466",
                     extra_config=extra)
    daemon.write_policy("vault-v1.toml", VAULT_POLICY)
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def run_token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run-secret") / "run-token"
    path.write_text(RUN_TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def vault_run(vault: Egressd, run_token_file: Path) -> dict:
    return vault.mint("vault", "--secret", f"RUN_TOKEN=@{run_token_file}")


def last_request(upstream: HttpsUpstream, path_prefix: str) -> dict:
    return next(r for r in reversed(upstream.requests) if r["path"].startswith(path_prefix))


def header(request: dict, name: str) -> str:
    return next(value for key, value in request["headers"] if key.lower() == name)


# --- mint -------------------------------------------------------------------------------------------------

def test_mint_gives_placeholders_never_values(vault: Egressd, vault_run: dict) -> None:
    placeholders = vault_run["placeholders"]
    assert set(placeholders) == {"API_TOKEN", "HEADER_ONLY", "RUN_TOKEN"}
    for placeholder in placeholders.values():
        assert placeholder.startswith("egressd_ph_") and len(placeholder) >= len("egressd_ph_") + 22
        assert placeholder.replace("_", "").isalnum()
    assert_no_canary(json.dumps(vault_run), "the mint output")


def test_a_value_on_the_command_line_is_refused(vault: Egressd) -> None:
    done = vault.cli("token", "mint", "--policy", "vault", "--secret", f"RUN_TOKEN={RUN_TOKEN}")
    assert done.returncode == 2
    assert "visible to every local user" in done.stderr
    assert_no_canary(done.stdout + done.stderr, "the refusal")


def test_mint_from_stdin(vault: Egressd) -> None:
    done = vault.cli("token", "mint", "--policy", "vault", "--secret", "RUN_TOKEN=-", input_text=RUN_TOKEN + "\n")
    assert done.returncode == 0, done.stderr
    assert "RUN_TOKEN" in json.loads(done.stdout)["placeholders"]


def test_mint_refuses_missing_and_unbound_secrets(vault: Egressd, run_token_file: Path) -> None:
    done = vault.cli("token", "mint", "--policy", "vault")
    assert done.returncode == 1 and "needs secret RUN_TOKEN" in done.stderr
    done = vault.cli("token", "mint", "--policy", "vault", "--secret", f"RUN_TOKEN=@{run_token_file}",
                     "--secret", f"NOT_BOUND=@{run_token_file}")
    assert done.returncode == 1 and "binds no secret NOT_BOUND" in done.stderr


# --- injection --------------------------------------------------------------------------------------------

def test_values_are_injected_where_bound(vault: Egressd, vault_run: dict, upstream: HttpsUpstream) -> None:
    ph = vault_run["placeholders"]
    result = vault.curl(f"https://api.example.test/inject/{ph['RUN_TOKEN']}?key={ph['API_TOKEN']}&n=1",
                        vault_run["token"], "-H", f"Authorization: Bearer {ph['API_TOKEN']}",
                        "-H", f"X-Api-Key: {ph['HEADER_ONLY']}")
    assert result.status == 200, result.body
    seen = last_request(upstream, "/inject/")
    assert header(seen, "authorization") == f"Bearer {API_TOKEN}"
    assert header(seen, "x-api-key") == HEADER_ONLY
    quoted = urllib.parse.quote(RUN_TOKEN, safe="")
    assert seen["path"] == f"/inject/{quoted}?key={urllib.parse.quote(API_TOKEN, safe='')}&n=1"
    line = vault.wait_audit(lambda a: a["event"] == "request" and a["path"].startswith("/inject/"))
    assert line["secrets"] == ["API_TOKEN", "HEADER_ONLY", "RUN_TOKEN"]


def test_basic_credentials_are_decoded_substituted_reencoded(vault: Egressd, vault_run: dict,
                                                             upstream: HttpsUpstream) -> None:
    ph = vault_run["placeholders"]
    result = vault.curl("https://api.example.test/basic", vault_run["token"], "-u", f"bot:{ph['API_TOKEN']}")
    assert result.status == 200
    sent = header(last_request(upstream, "/basic"), "authorization")
    assert base64.b64decode(sent.split()[1]).decode() == f"bot:{API_TOKEN}"


def test_the_body_is_never_substituted(vault: Egressd, vault_run: dict, upstream: HttpsUpstream) -> None:
    ph = vault_run["placeholders"]
    result = vault.curl("https://api.example.test/body", vault_run["token"], "--data-binary",
                        f"token={ph['API_TOKEN']}")
    assert result.status == 200
    assert last_request(upstream, "/body")["body"] == f"token={ph['API_TOKEN']}".encode()


@pytest.mark.parametrize(("url", "args"), [
    ("https://www.example.test/moved", ["-H", "Authorization: Bearer {API_TOKEN}"]),  # another allowed host
    ("https://api.example.test/q?key={HEADER_ONLY}", []),  # into the query, bound to one header
    ("https://api.example.test/h", ["-H", "Authorization: {HEADER_ONLY}"]),  # a header outside `where`
    ("https://api.example.test/{HEADER_ONLY}", []),  # the path
])
def test_secret_not_allowed(vault: Egressd, vault_run: dict, upstream: HttpsUpstream, url: str,
                            args: list[str]) -> None:
    ph = vault_run["placeholders"]
    before = len(upstream.requests)
    result = vault.curl(url.format(**ph), vault_run["token"], *[arg.format(**ph) for arg in args])
    assert result.status == 403 and result.headers["x-egressd-reason"] == "secret_not_allowed"
    assert json.loads(result.body)["reason"] == "secret_not_allowed"
    assert len(upstream.requests) == before
    vault.wait_audit(lambda a: a["reason"] == "secret_not_allowed")


def test_secret_unknown(vault: Egressd, vault_run: dict, run_token_file: Path, upstream: HttpsUpstream) -> None:
    other = vault.mint("vault", "--secret", f"RUN_TOKEN=@{run_token_file}")
    revoked = vault.mint("vault", "--secret", f"RUN_TOKEN=@{run_token_file}")
    assert vault.cli("token", "revoke", revoked["run_id"]).returncode == 0
    before = len(upstream.requests)
    for placeholder in (other["placeholders"]["API_TOKEN"], revoked["placeholders"]["API_TOKEN"],
                        "egressd_ph_MadeUpButShapedLikeOne0123456789"):
        result = vault.curl("https://api.example.test/unknown", vault_run["token"],
                            "-H", f"Authorization: Bearer {placeholder}")
        assert result.status == 403 and result.headers["x-egressd-reason"] == "secret_unknown"
    assert len(upstream.requests) == before
    vault.wait_audit(lambda a: a["reason"] == "secret_unknown")
    assert not (vault.root / "var" / "secrets" / f"{revoked['run_id']}.json").exists()


def test_per_run_values_survive_a_restart(vault: Egressd, vault_run: dict, upstream: HttpsUpstream) -> None:
    vault.stop()
    vault.start()
    result = vault.curl("https://api.example.test/after-restart", vault_run["token"],
                        "-H", f"X-Run: {vault_run['placeholders']['RUN_TOKEN']}")
    assert result.status == 200
    assert header(last_request(upstream, "/after-restart"), "x-run") == RUN_TOKEN


def test_secrets_dir_and_files_are_private(vault: Egressd, vault_run: dict) -> None:
    secrets_dir = vault.root / "var" / "secrets"
    assert secrets_dir.stat().st_mode & 0o777 == 0o700
    run_file = secrets_dir / f"{vault_run['run_id']}.json"
    assert run_file.stat().st_mode & 0o777 == 0o600




# --- replies are scrubbed -----------------------------------------------------------------------------------

def reflect(vault: Egressd, vault_run: dict, query: str, *args: str) -> CurlResult:
    ph = vault_run["placeholders"]
    return vault.curl(f"https://api.example.test/reflect/{ph['RUN_TOKEN']}?key={ph['API_TOKEN']}&{query}",
                      vault_run["token"], "-H", f"Authorization: Bearer {ph['API_TOKEN']}",
                      "-H", f"X-Api-Key: {ph['HEADER_ONLY']}", "-u", f"bot:{ph['API_TOKEN']}", *args)


@pytest.mark.parametrize("query", [
    "plain=1",
    "encoding=gzip", "encoding=deflate", "encoding=br", "encoding=zstd",
    "split=7", "split=1",
    "encoding=gzip&split=5",
    "size=3000000&split=65536",
    "size=2000000&encoding=gzip&split=4096",
])
@pytest.mark.parametrize("http", ["--http1.1", "--http2"])
def test_replies_never_carry_a_value(vault: Egressd, vault_run: dict, upstream: HttpsUpstream, query: str,
                                     http: str) -> None:
    result = reflect(vault, vault_run, query, http, "--compressed")
    assert result.status == 200, (result.status, result.body[:300])
    # The upstream saw the real values...
    seen = last_request(upstream, "/reflect/")
    assert header(seen, "x-api-key") == HEADER_ONLY
    # ...the client sees placeholders only, in the body and in every header.
    assert_no_canary(result.body, "a reply body")
    assert_no_canary(json.dumps(result.headers), "reply headers")
    first = json.loads(result.body.split("\n", 1)[0])
    assert first["headers"]["x-api-key"] == vault_run["placeholders"]["HEADER_ONLY"]
    assert result.headers["x-reflect-x-api-key"] == vault_run["placeholders"]["HEADER_ONLY"]


def test_scrubbing_a_large_reply_keeps_memory_flat(vault: Egressd, vault_run: dict) -> None:
    assert vault.process is not None
    reflect(vault, vault_run, "size=1000000&split=65536")  # warm up: buffers, caches
    before = rss_kib(vault.process.pid)
    result = reflect(vault, vault_run, "size=48000000&split=65536")
    assert result.status == 200 and len(result.body) >= 48_000_000
    assert_no_canary(result.body, "a large reply")
    grown_mib = (rss_kib(vault.process.pid) - before) / 1024
    assert grown_mib < 32, f"egressd grew by {grown_mib:.0f} MiB scrubbing a 48 MB reply"


def test_a_reply_that_cannot_be_scrubbed_is_refused(vault: Egressd, vault_run: dict) -> None:
    ph = vault_run["placeholders"]
    result = vault.curl("https://api.example.test/response-headers?Content-Encoding=x-unknown",
                        vault_run["token"], "-H", f"Authorization: Bearer {ph['API_TOKEN']}")
    assert result.status == 502 and result.headers["x-egressd-reason"] == "scrub_failed"
    assert json.loads(result.body)["reason"] == "scrub_failed"
    vault.wait_audit(lambda a: a["reason"] == "scrub_failed")


@pytest.mark.parametrize("http", ["--http1.1", "--http2"])
def test_a_reply_that_breaks_mid_stream_is_cut_off(vault: Egressd, vault_run: dict, http: str) -> None:
    result = reflect(vault, vault_run, "size=2000000&encoding=gzip&split=16384&corrupt=1", http, "--compressed")
    assert result.exit_code != 0  # the client sees a broken reply, never one that looks whole
    assert_no_canary(result.body, "a cut-off reply")
    vault.wait_audit(lambda a: a["reason"] == "scrub_failed" and a["event"] == "request")
    assert vault.alive()


def test_websocket_messages_are_scrubbed(vault: Egressd, vault_run: dict,
                                         websocket_upstream: WebSocketUpstream) -> None:
    placeholder = vault_run["placeholders"]["API_TOKEN"]
    with vault.tunnel("ws.example.test", vault_run["token"]) as sock:
        tls = vault.tls_in_tunnel(sock, "ws.example.test")
        status, received = websocket_exchange(tls, "ws.example.test", "/live",
                                              [("Authorization", f"Bearer {placeholder}")], ["hi"])
    assert status == 101
    # The upstream got the value in the handshake and sent it back in a message: the run reads a placeholder.
    assert received[0] == f"authorization=Bearer {placeholder}"
    assert received[1:] == ["echo:hi"]
    assert_no_canary(json.dumps(received), "WebSocket messages")


def test_scrubs_are_counted(vault: Egressd, vault_run: dict) -> None:
    reflect(vault, vault_run, "plain=1")
    metrics = vault.metrics()
    assert metrics[("egressd_scrubbed_replies_total", (("policy", "vault"), ("secret", "API_TOKEN")))] > 0
    assert metrics[("egressd_secret_injections_total", (("policy", "vault"), ("secret", "API_TOKEN")))] > 0


def test_canary_values_are_nowhere(vault: Egressd, vault_run: dict, run_token_file: Path) -> None:
    """After a whole session of injections, refusals and scrubbed replies, no form of any value is in the
    audit log, the daemon's output, any CLI output, or the state dir outside the secrets store."""
    outputs = [vault.cli("token", "list").stdout, vault.cli("policy", "reload").stdout,
               vault.cli("ca", "cert").stdout,
               vault.cli("policy", "explain", "--policy", "vault", "GET", "https://api.example.test/").stdout,
               vault.cli("token", "mint", "--policy", "vault", "--secret", f"RUN_TOKEN=@{run_token_file}").stdout,
               vault.cli("token", "mint", "--policy", "vault", "--secret", f"RUN_TOKEN={RUN_TOKEN}").stderr,
               vault.http_get("/metrics")[1]]
    for output in outputs:
        assert_no_canary(output, "CLI or endpoint output")
    assert_no_canary(vault.audit_path.read_text(), "the audit log")
    assert_no_canary(vault.log(), "egressd's stdout and stderr")
    state = vault.root / "var"
    for path in state.rglob("*"):
        if path.is_file() and path.parent != state / "secrets":
            assert_no_canary(path.read_bytes().decode("latin-1"), str(path))
