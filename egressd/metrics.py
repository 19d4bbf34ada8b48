"""Prometheus metrics (a contract: names and labels exactly as documented). Label values come only from
bounded sets (policy names, reason codes, decisions, standard methods), never from a host, a path, a run,
a token, a client address or a secret, so hostile traffic cannot grow the number of series."""

import platform
from collections.abc import Callable

import mitmproxy.version
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from egressd import __version__
from egressd.audit import Subject

STANDARD_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
RUN_EVENTS = {"mint": "minted", "revoke": "revoked", "expire": "expired"}
DNS_RESULTS = ("ok", "cached", "nxdomain", "servfail", "timeout", "forbidden")
UPSTREAM_ERROR_KINDS = ("connect", "tls", "timeout", "reset")

# `_created` samples would double every counter's series for no dashboard use.
disable_created_metrics()


def method_label(method: str) -> str:
    return method if method in STANDARD_METHODS else "OTHER"


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        Gauge("egressd_build_info", "egressd's build", ["version", "mitmproxy_version", "python_version"],
              registry=registry).labels(__version__, mitmproxy.version.VERSION, platform.python_version()).set(1)
        self.connects = Counter("egressd_connects_total", "Decisions at the CONNECT",
                                ["policy", "decision", "reason"], registry=registry)
        self.requests = Counter("egressd_requests_total", "Decisions on requests inside tunnels",
                                ["policy", "decision", "reason", "method"], registry=registry)
        self.request_duration = Histogram(
            "egressd_request_duration_seconds", "Time from a request to the upstream's response headers",
            ["policy"], registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.upstream_bytes = Counter("egressd_upstream_bytes_total", "Body bytes exchanged with upstreams",
                                      ["direction"], registry=registry)
        self.tunnels_active = Gauge("egressd_tunnels_active", "Open tunnels", registry=registry)
        self.runs_active = Gauge("egressd_runs_active", "Runs neither revoked nor expired", registry=registry)
        self.runs = Counter("egressd_runs_total", "Run events", ["event"], registry=registry)
        self.dns_lookups = Counter("egressd_dns_lookups_total", "DNS lookups by result", ["result"],
                                   registry=registry)
        self.secret_injections = Counter("egressd_secret_injections_total", "Secrets injected into requests",
                                         ["policy", "secret"], registry=registry)
        self.scrubbed_replies = Counter("egressd_scrubbed_replies_total", "Replies scrubbed of a secret",
                                        ["policy", "secret"], registry=registry)
        self.policy_reloads = Counter("egressd_policy_reloads_total", "Policy reloads", ["result"],
                                      registry=registry)
        self.policies_loaded = Gauge("egressd_policies_loaded", "Policy versions loaded", registry=registry)
        self.upstream_errors = Counter("egressd_upstream_errors_total", "Upstream failures by kind", ["kind"],
                                       registry=registry)
        self.audit_write_errors = Counter("egressd_audit_write_errors_total", "Failed audit log writes",
                                          registry=registry)
        self.ready = Gauge("egressd_ready", "1 when the CA, a policy and every listener are ready",
                           registry=registry)
        # Series that exist from the start, so rates and alerts work before the first event.
        for direction in ("sent", "received"):
            self.upstream_bytes.labels(direction)
        for event in RUN_EVENTS.values():
            self.runs.labels(event)
        for result in DNS_RESULTS:
            self.dns_lookups.labels(result)
        for result in ("ok", "error"):
            self.policy_reloads.labels(result)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind)

    def observe_decision(self, event: str, decision: str, reason: str | None, subject: Subject,
                         extra: dict[str, object]) -> None:
        """Counts what the audit log records, so the two always agree."""
        policy = subject.policy or ""
        if event == "connect":
            self.connects.labels(policy, decision, reason or "").inc()
        elif event == "request":
            method = extra.get("method")
            self.requests.labels(policy, decision, reason or "", method_label(str(method))).inc()
        elif event == "run":
            action = str(extra.get("action"))
            self.runs.labels(RUN_EVENTS[action]).inc()
            self.runs_active.inc(1 if action == "mint" else -1)

    def track(self, gauge: Gauge, read: Callable[[], float]) -> None:
        """A gauge read at scrape time from a value egressd already keeps (O(1), never a walk over flows)."""
        gauge.set_function(read)
