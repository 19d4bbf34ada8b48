"""The monitoring packaging: Prometheus rules (checked and unit-tested by promtool) and the Grafana dashboard.

Every metric name the dashboard and the rules use is one of the metrics contract's names (or a recording rule
defined here); every alert has summary and description annotations and promtool tests where it fires and
where it does not. promtool comes from the Debian package `prometheus`; without it these tests fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.prometheus import (
    DASHBOARD_FILE,
    INSTALL_HINT,
    PROMTOOL_BINARY,
    RULES_FILE,
    RULES_TEST_FILE,
    base_metric,
    dashboard_exprs,
    iter_panels,
    load_dashboard,
    load_rules,
    metric_names,
    render_grafana,
    rules_exprs,
)

# The metrics contract (issue 5), with each metric's labels; plus the readiness gauge and Prometheus's `up`.
CONTRACT_METRICS: dict[str, frozenset[str]] = {
    "egressd_build_info": frozenset({"version", "mitmproxy_version", "python_version"}),
    "egressd_connects_total": frozenset({"policy", "decision", "reason"}),
    "egressd_requests_total": frozenset({"policy", "decision", "reason", "method"}),
    "egressd_request_duration_seconds": frozenset({"policy", "le"}),
    "egressd_upstream_bytes_total": frozenset({"direction"}),
    "egressd_tunnels_active": frozenset(),
    "egressd_runs_active": frozenset(),
    "egressd_runs_total": frozenset({"event"}),
    "egressd_dns_lookups_total": frozenset({"result"}),
    "egressd_secret_injections_total": frozenset({"policy", "secret"}),
    "egressd_scrubbed_replies_total": frozenset({"policy", "secret"}),
    "egressd_policy_reloads_total": frozenset({"result"}),
    "egressd_policies_loaded": frozenset(),
    "egressd_upstream_errors_total": frozenset({"kind"}),
    "egressd_audit_write_errors_total": frozenset(),
    "egressd_ready": frozenset(),
    "up": frozenset(),
}
TARGET_LABELS = frozenset({"job", "instance"})

EXPECTED_ALERTS = {
    "EgressdDown",
    "EgressdNotReady",
    "EgressdRefusalSpike",
    "EgressdForbiddenAddressSeen",
    "EgressdSecretNotAllowedSeen",
    "EgressdUpstreamErrorRatioHigh",
    "EgressdPolicyReloadFailing",
    "EgressdAuditWriteErrors",
}
EXPECTED_RECORDINGS = {
    "policy_decision:egressd_requests:rate5m",
    "policy_reason:egressd_refusals:rate5m",
    "policy:egressd_request_duration_seconds:p50",
    "policy:egressd_request_duration_seconds:p95",
    "policy:egressd_request_duration_seconds:p99",
    "kind:egressd_upstream_errors:rate5m",
    "egressd:upstream_error_ratio:rate5m",
}
# What the dashboard must show, by the series its panels select.
DASHBOARD_MUST_SELECT = {
    "policy_decision:egressd_requests:rate5m",
    "policy_reason:egressd_refusals:rate5m",
    "policy:egressd_request_duration_seconds:p50",
    "policy:egressd_request_duration_seconds:p95",
    "policy:egressd_request_duration_seconds:p99",
    "egressd_tunnels_active",
    "egressd_runs_active",
    "egressd_dns_lookups_total",
    "egressd_secret_injections_total",
    "egressd_scrubbed_replies_total",
    "kind:egressd_upstream_errors:rate5m",
    "egressd_policy_reloads_total",
    "egressd_audit_write_errors_total",
}
PROMTOOL_TIMEOUT = 60
DATASOURCE = "${datasource}"
POLICY_FILTER = 'policy=~"$policy"'


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool") or (PROMTOOL_BINARY if Path(PROMTOOL_BINARY).exists() else None)
    if binary is None:
        pytest.fail(f"promtool is missing: {INSTALL_HINT}")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT, cwd=cwd)


def rule_list() -> list[dict]:
    return [rule for group in load_rules(RULES_FILE)["groups"] for rule in group["rules"]]


def recording_names() -> set[str]:
    return {rule["record"] for rule in rule_list() if "record" in rule}


def alerts() -> list[dict]:
    return [rule for rule in rule_list() if "alert" in rule]


def panels() -> list[dict]:
    return list(iter_panels(load_dashboard(DASHBOARD_FILE)["panels"]))


def variables() -> dict[str, dict]:
    return {variable["name"]: variable for variable in load_dashboard(DASHBOARD_FILE)["templating"]["list"]}


def unknown_names(exprs: list[str]) -> dict[str, set[str]]:
    known = set(CONTRACT_METRICS) | recording_names()
    unknown = {}
    for expr in exprs:
        names = {name for name in metric_names(expr) if base_metric(name) not in known and name not in known}
        if names:
            unknown[expr] = names
    return unknown


# --- the name reader the checks below rely on ---------------------------------------------------------------

def test_metric_names_reads_selectors_not_functions_labels_or_variables() -> None:
    expr = ('histogram_quantile(0.99, sum by (policy, le) (rate(egressd_request_duration_seconds_bucket'
            '{policy=~"$policy", le!="+Inf"}[$__rate_interval] offset 5m))) / ignoring(kind) group_left '
            'kind:egressd_upstream_errors:rate5m or vector(1e3) and on() up{job="egressd"} == bool 0')
    assert metric_names(expr) == {
        "egressd_request_duration_seconds_bucket", "kind:egressd_upstream_errors:rate5m", "up",
    }
    assert metric_names('sum(x_total) without (instance) > inf') == {"x_total"}
    assert render_grafana('rate(a{policy=~"$policy"}[$__rate_interval]) ${policy}') == 'rate(a{policy=~".*"}[1m]) .*'


# --- rules --------------------------------------------------------------------------------------------------

def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", str(RULES_FILE))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_test_rules() -> None:
    done = promtool("test", "rules", RULES_TEST_FILE.name, cwd=RULES_TEST_FILE.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_rules_file_has_the_expected_alerts_and_recording_rules() -> None:
    assert {rule["alert"] for rule in alerts()} == EXPECTED_ALERTS
    assert EXPECTED_RECORDINGS <= recording_names()
    for name in recording_names():
        assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", name), f"{name} is not level:metric:operations"


def test_every_alert_has_summary_description_and_severity() -> None:
    for rule in alerts():
        annotations = rule.get("annotations") or {}
        assert str(annotations.get("summary", "")).strip(), f"{rule['alert']}: no summary"
        assert str(annotations.get("description", "")).strip(), f"{rule['alert']}: no description"
        assert (rule.get("labels") or {}).get("severity") in {"warning", "critical"}, f"{rule['alert']}: severity"
    severity = {rule["alert"]: rule["labels"]["severity"] for rule in alerts()}
    assert severity["EgressdForbiddenAddressSeen"] == "critical"
    assert severity["EgressdAuditWriteErrors"] == "critical"


def test_rules_use_only_contract_metrics_and_defined_recordings() -> None:
    assert unknown_names(rules_exprs(RULES_FILE)) == {}


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = load_rules(RULES_TEST_FILE)
    assert [str(path) for path in tests["rule_files"]] == [RULES_FILE.name]
    firing: set[str] = set()
    quiet: set[str] = set()
    for group in tests["tests"]:
        for case in group.get("alert_rule_test") or ():
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts without a firing test case"
    assert names - quiet == set(), "alerts without a not-firing test case"
    assert (firing | quiet) - names == set(), "test cases for alerts that do not exist"


def test_recording_rules_are_tested() -> None:
    tests = load_rules(RULES_TEST_FILE)
    tested = set()
    for group in tests["tests"]:
        for case in group.get("promql_expr_test") or ():
            tested |= metric_names(case["expr"]) & recording_names()
    assert len(tested) >= 2, tested
    assert EXPECTED_RECORDINGS <= tested


def test_test_file_uses_contract_metric_names_and_labels() -> None:
    series_re = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\}$")
    for group in load_rules(RULES_TEST_FILE)["tests"]:
        for series in group.get("input_series") or ():
            match = series_re.match(series["series"].strip())
            assert match, series["series"]
            name, labels = match.group(1), set(re.findall(r"(\w+)\s*=", match.group(2)))
            base = base_metric(name)
            assert base in CONTRACT_METRICS, f"{name} is not a contract metric"
            expected = CONTRACT_METRICS[base] | TARGET_LABELS
            assert labels == expected, (name, labels, expected)


# --- dashboard ----------------------------------------------------------------------------------------------

def test_dashboard_is_current_schema_json() -> None:
    dashboard = load_dashboard(DASHBOARD_FILE)  # json.loads: valid JSON or an error
    assert dashboard["uid"] == "egressd"
    assert dashboard["schemaVersion"] >= 39
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    assert dashboard["title"]
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_dashboard_variables() -> None:
    found = variables()
    datasource = found["datasource"]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    policy = found["policy"]
    assert policy["type"] == "query"
    query = policy["query"]["query"] if isinstance(policy["query"], dict) else policy["query"]
    assert query == "label_values(egressd_connects_total, policy)"
    assert policy["datasource"]["uid"] == DATASOURCE
    assert policy["multi"] is True and policy["includeAll"] is True and policy["allValue"] == ".*"


def test_every_panel_and_target_uses_the_datasource_variable() -> None:
    assert panels()
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat"}, panel["title"]
        assert panel["datasource"]["uid"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", {}).get("uid") == DATASOURCE, (panel["title"], target)
            assert target["expr"] and "legendFormat" in target and target["refId"], (panel["title"], target)


def test_dashboard_filters_by_policy_wherever_there_is_a_policy_label() -> None:
    by_policy = {name for name, labels in CONTRACT_METRICS.items() if "policy" in labels}
    by_policy |= {name for name in recording_names() if "policy" in name.split(":")[0].split("_")}
    for expr in dashboard_exprs(DASHBOARD_FILE):
        selectors = [name for name in metric_names(expr) if base_metric(name) in by_policy or name in by_policy]
        assert expr.count(POLICY_FILTER) >= len(selectors), f"{expr}: not filtered by {POLICY_FILTER}"


def test_dashboard_uses_only_contract_metrics_and_defined_recordings() -> None:
    exprs = dashboard_exprs(DASHBOARD_FILE)
    assert unknown_names(exprs) == {}
    selected = set().union(*(metric_names(expr) for expr in exprs))
    assert DASHBOARD_MUST_SELECT - selected == set()
    assert any(
        'egressd_policy_reloads_total{result="error"}' in expr for expr in exprs
    ), "no panel for policy reload failures"


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    """Each expression, as Grafana sends it, written as a recording rule that promtool must accept."""
    exprs = [render_grafana(expr) for expr in dashboard_exprs(DASHBOARD_FILE)]
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for number, expr in enumerate(exprs):
        escaped = expr.replace("\\", "\\\\").replace('"', '\\"')
        lines += [f"      - record: dashboard:expr_{number}:check", f'        expr: "{escaped}"']
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text("\n".join(lines) + "\n")
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
