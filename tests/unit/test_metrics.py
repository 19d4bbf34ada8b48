"""Metrics without a daemon: labels stay within bounded sets, readiness names what is missing."""

import pytest
from prometheus_client import generate_latest

from egressd.audit import Subject
from egressd.metrics import Metrics, method_label
from egressd.metrics_endpoint import not_ready


@pytest.mark.parametrize(("method", "label"), [("GET", "GET"), ("PATCH", "PATCH"), ("get", "OTHER"),
                                               ("PROPFIND", "OTHER"), ("X" * 1000, "OTHER")])
def test_method_label(method: str, label: str) -> None:
    assert method_label(method) == label


def test_decisions_are_counted_by_policy_decision_reason_only() -> None:
    metrics = Metrics()
    for index in range(100):
        subject = Subject(client=f"127.0.0.1:{index}", run_id=f"run_{index}", policy="p", host=f"h{index}.test")
        metrics.observe_decision("connect", "deny", "host_not_allowed", subject, {})
        metrics.observe_decision("request", "deny", "path_not_allowed", subject,
                                 {"method": f"M{index}", "path": f"/{index}"})
    text = generate_latest(metrics.registry).decode()
    assert 'egressd_connects_total{decision="deny",policy="p",reason="host_not_allowed"} 100.0' in text
    assert 'egressd_requests_total{decision="deny",method="OTHER",policy="p",reason="path_not_allowed"} 100.0' in text
    assert "h1.test" not in text and "run_1" not in text and "127.0.0.1" not in text
    assert "_created" not in text


def test_run_events_move_the_active_gauge() -> None:
    metrics = Metrics()
    subject = Subject(run_id="run_x", policy="p")
    for action in ("mint", "mint", "revoke", "expire", "mint"):
        metrics.observe_decision("run", "allow", None, subject, {"action": action})
    text = generate_latest(metrics.registry).decode()
    assert "egressd_runs_active 1.0" in text
    assert 'egressd_runs_total{event="minted"} 3.0' in text


def test_not_ready_names_what_is_missing() -> None:
    assert not_ready(True, True, True) == []
    assert not_ready(False, True, True) == ["ca"]
    assert not_ready(True, False, False) == ["policies", "listeners"]
