"""A real Prometheus (Debian package `prometheus`) scrapes the real egressd every second: every PromQL
expression of the dashboard and the rules parses and returns data, and the attack alert fires."""

from collections.abc import Iterator

import pytest

from tests.support.egressd_process import Egressd, basic
from tests.support.prometheus import Prometheus, dashboard_exprs, load_rules, metric_names, render_grafana

# Series that exist only once their event happened (secrets arrive with their own issue).
ONLY_AFTER_THEIR_EVENT = ("secret",)


def happened(expr: str) -> bool:
    return not any(word in expr for word in ONLY_AFTER_THEIR_EVENT)


RULES = [rule for group in load_rules()["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def prometheus(egressd: Egressd, run: dict) -> Iterator[Prometheus]:
    with Prometheus([egressd.metrics_listen]) as server:
        server.wait_for('up{job="egressd"} == 1', timeout=30)
        # Scripted traffic between scrapes: allowed, refused at the CONNECT and inside the tunnel, an
        # upstream error, and an attack (a name resolving into forbidden space).
        for _ in range(3):
            assert egressd.curl("https://api.example.test/prom", run["token"]).status == 200
        egressd.curl("https://www.example.test/admin", run["token"])
        egressd.curl("https://closed.example.test/", run["token"])
        sock, status, _, _ = egressd.connect("canary.example.test:443", basic(run["token"]))
        sock.close()
        assert status == 403
        server.wait_for('egressd_connects_total{reason="forbidden_address"} > 0', timeout=30)
        yield server


@pytest.mark.parametrize("expr", dashboard_exprs(), ids=lambda e: e[:60])
def test_dashboard_queries_return_data(prometheus: Prometheus, expr: str) -> None:
    rendered = render_grafana(expr)
    prometheus.query(rendered)  # parses: raises PrometheusError otherwise
    if happened(expr):
        assert prometheus.wait_for(rendered, timeout=15), rendered


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.get("record") or r.get("alert"))
def test_rule_expressions_parse_and_return_data(prometheus: Prometheus, rule: dict) -> None:
    """Recording rules return data; an alert is quiet while all is well, so its series must."""
    expr = rule["expr"]
    prometheus.query(expr)
    if "record" in rule:
        assert prometheus.wait_for(expr, timeout=15), expr
        return
    for name in metric_names(expr):
        if happened(name):
            assert prometheus.wait_for(name, timeout=15), f"{rule['alert']}: no {name} series"


def test_recording_rules_are_evaluated(prometheus: Prometheus) -> None:
    groups = prometheus.rules()["groups"]
    recorded = [rule["name"] for group in groups for rule in group["rules"] if rule["type"] == "recording"]
    assert recorded
    for name in recorded:
        assert prometheus.wait_for(name, timeout=15), name
    assert all(rule["health"] == "ok" for group in groups for rule in group["rules"])


def test_forbidden_address_alert_fires(prometheus: Prometheus) -> None:
    prometheus.wait_for('ALERTS{alertname="EgressdForbiddenAddressSeen", policy="test"}', timeout=30)
