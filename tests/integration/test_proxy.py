"""Allowed traffic through the real daemon with real clients, and the daemon's lifecycle: runs, tokens,
reloads, restarts, the CLI contract."""

import json
import signal
import ssl
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.egressd_process import Egressd, basic, read_response, rss_kib
from tests.support.upstream import HttpsUpstream, expected_bytes

MINT_FIELDS = {"run_id", "token", "policy", "version", "policy_sha256", "expires_at", "proxy_url", "placeholders"}


def test_curl_http1_and_http2(egressd: Egressd, run: dict, upstream: HttpsUpstream) -> None:
    for flag, version in (("--http1.1", "1.1"), ("--http2", "2")):
        result = egressd.curl("https://api.example.test/hello?x=1", run["token"], flag)
        assert result.status == 200, result.stderr
        echo = result.json()
        assert echo["http_version"] == version
        assert echo["sni"] == "api.example.test"
        assert echo["query"] == "x=1"
        assert "proxy-authorization" not in echo["headers"]
    line = egressd.wait_audit(lambda a: a["event"] == "request" and a["path"] == "/hello")
    assert line["decision"] == "allow" and line["reason"] is None
    assert line["addr"] == "127.0.0.10" and line["host"] == "api.example.test" and line["port"] == 443
    assert line["status"] == 200 and line["response_bytes"] > 0


def test_python_client(egressd: Egressd, run: dict) -> None:
    context = ssl.create_default_context(cafile=str(egressd.ca_cert))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"https": run["proxy_url"]}),
        urllib.request.HTTPSHandler(context=context),
    )
    with opener.open("https://api.example.test/from-python", timeout=10) as response:
        assert response.status == 200
        assert json.loads(response.read())["path"] == "/from-python"


def test_redirects_are_passed_back_not_followed(egressd: Egressd, run: dict, upstream: HttpsUpstream) -> None:
    target = "https://canary.example.test/"
    result = egressd.curl(f"https://api.example.test/redirect?to={target}", run["token"])
    assert result.status == 302
    assert result.headers["location"] == target
    # The client's next hop is checked like any other request.
    followed = egressd.curl(f"https://api.example.test/redirect?to={target}", run["token"], "-L")
    assert followed.exit_code != 0
    egressd.wait_audit(lambda a: a["host"] == "canary.example.test" and a["reason"] == "forbidden_address")


def test_large_bodies_stream_and_are_counted(egressd: Egressd, run: dict, tmp_path: Path) -> None:
    assert egressd.process is not None
    before = rss_kib(egressd.process.pid)
    size = 48 * 1024 * 1024
    out = tmp_path / "body"
    result = egressd.curl(f"https://api.example.test/bytes/{size}", run["token"], "-o", str(out))
    assert result.status == 200
    assert out.read_bytes() == expected_bytes(size)
    grown_mib = (rss_kib(egressd.process.pid) - before) / 1024
    assert grown_mib < 24, f"egressd grew by {grown_mib:.0f} MiB streaming a {size >> 20} MiB body"
    line = egressd.wait_audit(lambda a: a["event"] == "request" and a["path"] == f"/bytes/{size}")
    assert line["response_bytes"] == size
    upload = tmp_path / "upload"
    upload.write_bytes(b"x" * 300_000)
    result = egressd.curl("https://api.example.test/upload", run["token"], "--data-binary", f"@{upload}")
    assert result.json()["body_len"] == 300_000
    line = egressd.wait_audit(lambda a: a["event"] == "request" and a["path"] == "/upload")
    assert line["request_bytes"] == 300_000


def test_mint_json_and_token_list(egressd: Egressd) -> None:
    minted = egressd.mint("test", "--ttl", "120", "--label", "ci job 7")
    assert set(minted) == MINT_FIELDS
    assert minted["policy"] == "test" and minted["version"] == 1
    assert len(minted["token"]) >= 22 and minted["token"] in minted["proxy_url"]
    assert minted["expires_at"].endswith("Z")
    listed = egressd.cli("token", "list")
    assert listed.returncode == 0
    runs = [json.loads(line) for line in listed.stdout.splitlines()]
    mine = next(r for r in runs if r["run_id"] == minted["run_id"])
    assert mine["label"] == "ci job 7" and mine["state"] == "active"
    assert minted["token"] not in listed.stdout
    state = (egressd.root / "var" / "egressd.db").read_bytes()
    assert minted["token"].encode() not in state


def test_mint_refuses_unknown_policy(egressd: Egressd) -> None:
    done = egressd.cli("token", "mint", "--policy", "nope")
    assert done.returncode == 1 and "no policy nope" in done.stderr


def test_revoke_closes_open_tunnels_within_a_second(fresh_egressd: Egressd) -> None:
    fresh_egressd.start()
    minted = fresh_egressd.mint("test")
    with fresh_egressd.tunnel("api.example.test", minted["token"]) as sock:
        tls = fresh_egressd.tls_in_tunnel(sock, "api.example.test")
        tls.sendall(b"GET /open HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
        assert read_response(tls)[0] == 200
        assert fresh_egressd.cli("token", "revoke", minted["run_id"]).returncode == 0
        revoked_at = time.monotonic()
        tls.settimeout(3)
        assert tls.recv(1) == b""  # closed by egressd
        assert time.monotonic() - revoked_at < 1.0
    fresh_egressd.wait_audit(lambda a: a["event"] == "run" and a["action"] == "revoke")


def test_expiry_closes_open_tunnels(fresh_egressd: Egressd) -> None:
    fresh_egressd.start()
    minted = fresh_egressd.mint("test", "--ttl", "2")
    with fresh_egressd.tunnel("api.example.test", minted["token"]) as sock:
        tls = fresh_egressd.tls_in_tunnel(sock, "api.example.test")
        tls.sendall(b"GET /open HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
        assert read_response(tls)[0] == 200
        tls.settimeout(5)
        assert tls.recv(1) == b""  # closed by egressd once the run expired
    line = fresh_egressd.wait_audit(lambda a: a["event"] == "run" and a["action"] == "expire")
    assert line["run_id"] == minted["run_id"]


def test_runs_survive_a_restart(fresh_egressd: Egressd) -> None:
    fresh_egressd.start()
    minted = fresh_egressd.mint("test")
    fresh_egressd.stop()
    fresh_egressd.start()
    assert fresh_egressd.curl("https://api.example.test/", minted["token"]).status == 200


V2 = 'name = "test"\nversion = 2\n[[allow]]\nhost = "www.example.test"\nreason = "v2 only reaches www"\n'


def test_run_stays_on_its_version_after_a_newer_one_loads(fresh_egressd: Egressd) -> None:
    fresh_egressd.start()
    old = fresh_egressd.mint("test")
    fresh_egressd.write_policy("test-v2.toml", V2)
    fresh_egressd.signal(signal.SIGHUP)
    fresh_egressd.wait_audit(lambda a: True)  # the daemon is alive and writing
    deadline = time.monotonic() + 5
    while fresh_egressd.mint("test")["version"] != 2:
        assert time.monotonic() < deadline, "SIGHUP did not reload"
        time.sleep(0.1)
    assert fresh_egressd.curl("https://api.example.test/", old["token"]).status == 200
    new = fresh_egressd.mint("test")
    sock, status, headers, _ = fresh_egressd.connect("api.example.test:443", basic(new["token"]))
    sock.close()
    assert status == 403 and headers["x-egressd-reason"] == "host_not_allowed"
    pinned = fresh_egressd.mint("test", "--version", "1")
    assert pinned["version"] == 1


def test_bad_reload_keeps_the_last_good_policies(fresh_egressd: Egressd) -> None:
    fresh_egressd.start()
    minted = fresh_egressd.mint("test")
    fresh_egressd.write_policy("broken.toml", 'name = "broken"\nversion = 1\n[[allow]]\nhost = "*.evil.test"\n')
    done = fresh_egressd.cli("policy", "reload")
    assert done.returncode == 1
    assert "broken.toml" in done.stderr and "allow[0].host" in done.stderr and "wildcard" in done.stderr
    fresh_egressd.signal(signal.SIGHUP)
    time.sleep(0.3)
    assert fresh_egressd.alive()
    assert fresh_egressd.curl("https://api.example.test/", minted["token"]).status == 200


def test_changed_content_under_the_same_version_is_refused(fresh_egressd: Egressd) -> None:
    fresh_egressd.start()
    widened = (fresh_egressd.policies / "test-v1.toml").read_text() + (
        '\n[[allow]]\nhost = "other.example.test"\nreason = "sneaked in without a new version"\n')
    fresh_egressd.write_policy("test-v1.toml", widened)
    done = fresh_egressd.cli("policy", "reload")
    assert done.returncode == 1 and "immutable" in done.stderr
    minted = fresh_egressd.mint("test")
    sock, status, headers, _ = fresh_egressd.connect("other.example.test:443", basic(minted["token"]))
    sock.close()
    assert headers["x-egressd-reason"] == "host_not_allowed"
    # Also after a restart: the recorded content keeps serving.
    fresh_egressd.stop()
    fresh_egressd.start()
    minted = fresh_egressd.mint("test")
    sock, status, headers, _ = fresh_egressd.connect("other.example.test:443", basic(minted["token"]))
    sock.close()
    assert (status, headers["x-egressd-reason"]) == (403, "host_not_allowed")
    assert "immutable" in fresh_egressd.log()


def test_policy_explain(egressd: Egressd, dns) -> None:
    def explain(*words: str) -> dict:
        done = egressd.cli("policy", "explain", *words)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert explain("--policy", "test", "GET", "https://api.example.test/x") == {
        "decision": "allow", "reason": None, "detail": ""}
    assert explain("--policy", "test@1", "POST", "https://www.example.test/docs")["reason"] == "method_not_allowed"
    assert explain("--policy", "test", "GET", "https://canary.example.test/")["reason"] == "forbidden_address"
    assert explain("--policy", "test", "GET", "http://api.example.test/")["reason"] == "https_only"
    assert explain("--policy", "test", "GET", "https://127.0.0.1/")["reason"] == "ip_literal"
    assert explain("--policy", "test", "GET", "https://api.example.test:8443/")["reason"] == "port_not_allowed"
    before = len(dns.queries)
    assert explain("--policy", "test", "GET", "https://not-listed.test/")["reason"] == "host_not_allowed"
    assert not any(name == "not-listed.test" for name, _ in dns.queries[before:])


def test_policy_check_cli(egressd: Egressd, tmp_path: Path) -> None:
    good = Path(__file__).resolve().parents[2] / "policies" / "roastery-bot-v3.toml"
    done = egressd.cli("policy", "check", str(good))
    assert done.returncode == 0 and "roastery-bot@3" in done.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nversion = 1\n[[allow]]\nhost = "https://10.0.0.1:443"\nreason = ""\n')
    done = egressd.cli("policy", "check", str(bad))
    assert done.returncode == 1
    assert str(bad) in done.stderr and "allow[0].host" in done.stderr and "allow[0].reason" in done.stderr


def test_ca_cert_and_key_mode(egressd: Egressd) -> None:
    done = egressd.cli("ca", "cert")
    assert done.returncode == 0 and done.stdout.startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" not in done.stdout
    key = egressd.root / "ca" / "mitmproxy-ca.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    control = egressd.root / "var" / "control.sock"
    assert control.stat().st_mode & 0o777 == 0o600


def test_version() -> None:
    import subprocess
    import sys

    from egressd import __version__

    done = subprocess.run([sys.executable, "-m", "egressd", "--version"], capture_output=True, text=True)
    assert done.stdout.strip() == f"egressd {__version__}"


@pytest.mark.parametrize(("config", "expected"), [
    ("[proxy]\nlisten = [\"127.0.0.1:3128\"]\nbogus = 1\n", "proxy.bogus: unknown key"),
    ("[dns]\ntimeout = \"slow\"\n", "dns.timeout"),
    ("[upstream]\nallow_cidrs = [\"10.0.0.0/33\"]\n", "upstream.allow_cidrs"),
    ("[dns]\nmin_ttl = 10\nmax_ttl = 5\n", "min_ttl"),
])
def test_bad_config_is_refused_at_start(tmp_path: Path, config: str, expected: str) -> None:
    import subprocess
    import sys

    path = tmp_path / "bad.toml"
    path.write_text(config)
    done = subprocess.run([sys.executable, "-m", "egressd", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 2
    assert str(path) in done.stderr and expected in done.stderr
