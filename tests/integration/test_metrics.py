"""The metrics endpoint against the real daemon: counts follow traffic exactly, series stay bounded under
hostile traffic, and /healthz and /readyz say what they promise."""

import socket
import threading
import time

from tests.integration.conftest import TEST_POLICY
from tests.support.egressd_process import Egressd, basic, read_response

Key = tuple[str, tuple[tuple[str, str], ...]]


def sample(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def refused_connects(egressd: Egressd, token: str, targets: list[str]) -> None:
    """CONNECTs on one keep-alive connection, each answered with a refusal."""
    with socket.create_connection(("127.0.0.1", egressd.proxy_port), timeout=10) as sock:
        for target in targets:
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                         f"Proxy-Authorization: {basic(token)}\r\n\r\n".encode())
            status, _, _ = read_response(sock)
            assert status == 403


def test_counts_follow_traffic(fresh_egressd: Egressd) -> None:
    egressd = fresh_egressd.start()
    run = egressd.mint("test")
    for index in range(3):
        assert egressd.curl(f"https://api.example.test/ok/{index}", run["token"]).status == 200
    for _ in range(2):
        assert egressd.curl("https://www.example.test/docs/x", run["token"], "-X", "POST").status == 403
    refused_connects(egressd, run["token"], ["other.example.test:443", "other.example.test:443", "127.0.0.1:443"])
    sock, status, _, _ = egressd.connect("api.example.test:443", None)
    sock.close()
    assert status == 407
    egressd.wait_audit(lambda a: a["event"] == "request" and a["path"] == "/ok/2")

    metrics = egressd.metrics()
    assert sample(metrics, "egressd_connects_total", policy="test", decision="allow", reason="") == 5
    assert sample(metrics, "egressd_connects_total", policy="test", decision="deny", reason="host_not_allowed") == 2
    assert sample(metrics, "egressd_connects_total", policy="test", decision="deny", reason="ip_literal") == 1
    assert sample(metrics, "egressd_connects_total", policy="", decision="deny", reason="auth_required") == 1
    assert sample(metrics, "egressd_requests_total", policy="test", decision="allow", reason="",
                  method="GET") == 3
    assert sample(metrics, "egressd_requests_total", policy="test", decision="deny",
                  reason="method_not_allowed", method="POST") == 2
    assert sample(metrics, "egressd_request_duration_seconds_count", policy="test") == 3
    assert sample(metrics, "egressd_runs_total", event="minted") == 1
    assert sample(metrics, "egressd_runs_active") == 1
    assert sample(metrics, "egressd_dns_lookups_total", result="ok") == 2  # api, www; then cached
    assert sample(metrics, "egressd_dns_lookups_total", result="cached") == 3
    assert sample(metrics, "egressd_upstream_bytes_total", direction="received") > 0
    assert sample(metrics, "egressd_policies_loaded") == 1
    assert sample(metrics, "egressd_tunnels_active") == 0
    assert sample(metrics, "egressd_ready") == 1
    build = [labels for (name, labels) in metrics if name == "egressd_build_info"]
    assert [key for key, _ in build[0]] == ["mitmproxy_version", "python_version", "version"]

    egressd.cli("token", "revoke", run["run_id"])
    metrics = egressd.metrics()
    assert sample(metrics, "egressd_runs_total", event="revoked") == 1
    assert sample(metrics, "egressd_runs_active") == 0


def test_upstream_errors_and_reload_failures_are_counted(fresh_egressd: Egressd, wrong_cert_upstream) -> None:
    egressd = fresh_egressd.start()
    run = egressd.mint("test")
    egressd.curl("https://closed.example.test/", run["token"])
    egressd.curl("https://badcert.example.test/", run["token"])
    egressd.write_policy("broken.toml", "this is not toml")
    assert egressd.cli("policy", "reload").returncode == 1
    metrics = egressd.metrics()
    assert sample(metrics, "egressd_upstream_errors_total", kind="connect") == 1
    assert sample(metrics, "egressd_upstream_errors_total", kind="tls") >= 1
    assert sample(metrics, "egressd_policy_reloads_total", result="error") == 1
    assert sample(metrics, "egressd_policy_reloads_total", result="ok") == 0


def test_ten_thousand_refused_hosts_add_no_series(egressd: Egressd, run: dict) -> None:
    refused_connects(egressd, run["token"], ["warmup.refused.test:443"])
    before = egressd.metrics()
    targets = [f"h{index}-{run['run_id'][-6:]}.refused.test:443" for index in range(10_000)]
    refused_connects(egressd, run["token"], targets)
    _, text = egressd.http_get("/metrics")
    after = egressd.metrics()
    assert set(after) == set(before)
    assert sample(after, "egressd_connects_total", policy="test", decision="deny", reason="host_not_allowed") == (
        sample(before, "egressd_connects_total", policy="test", decision="deny", reason="host_not_allowed") + 10_000)
    assert "refused.test" not in text and run["run_id"] not in text and run["token"] not in text
    assert "127.0.0.1" not in text


def test_health_and_readiness(fresh_egressd: Egressd) -> None:
    (fresh_egressd.policies / "test-v1.toml").unlink()
    egressd = fresh_egressd.start()
    status, body = egressd.http_get("/readyz")
    assert status == 503 and '"policies"' in body
    assert egressd.http_get("/healthz")[0] == 200
    assert sample(egressd.metrics(), "egressd_ready") == 0
    egressd.write_policy("test-v1.toml", TEST_POLICY)
    assert egressd.cli("policy", "reload").returncode == 0
    status, body = egressd.http_get("/readyz")
    assert status == 200 and '"missing": []' in body
    assert egressd.http_get("/nope")[0] == 404

    # /healthz answers while the proxy is under load.
    run = egressd.mint("test")
    stop = time.monotonic() + 3

    def load() -> None:
        while time.monotonic() < stop:
            egressd.curl("https://api.example.test/load", run["token"])

    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(10):
            assert egressd.http_get("/healthz", timeout=2)[0] == 200
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.join(10)
