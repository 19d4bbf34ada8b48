"""The daemon's shared state and the operations on it: authenticate, check a target, mint, revoke, list,
reload, explain. The mitmproxy addons and the control socket are thin adapters over this."""

import ipaddress
import logging
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from egressd.audit import AuditLog, Subject
from egressd.config import Config
from egressd.credentials import token_from_header
from egressd.decision import RequestFacts, Target, decide_addresses, decide_request, decide_target
from egressd.dns import DnsFailure, Resolver
from egressd.egress_tally import EgressTally
from egressd.injection import RunSecrets
from egressd.metrics import Metrics
from egressd.policy import Policy
from egressd.policy_store import PolicyLock, PolicyStore
from egressd.reasons import ALLOW, Decision, Reason, deny
from egressd.runs import Run, RunStore, rfc3339
from egressd.secret_store import SecretError, SecretStore, check_value
from egressd.tunnels import Tunnels

log = logging.getLogger(__name__)

DEFAULT_TTL = 3600
MAX_TTL = 30 * 24 * 3600


# A name with no A/AAAA records is, to an operator, as missing as one that does not exist.
DNS_FAILURE_RESULTS = {"nxdomain": "nxdomain", "no_answer": "nxdomain", "servfail": "servfail", "timeout": "timeout"}


class RequestError(ValueError):
    """A control request that cannot be carried out; the message says why."""


@dataclass(frozen=True, slots=True)
class TargetCheck:
    decision: Decision
    target: Target | None = None
    addr: str | None = None


class Service:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = state = config.path(config.paths.state)
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        database = state / "egressd.db"
        self.runs = RunStore(database)
        self.policies = PolicyStore(config.path(config.paths.policies), PolicyLock(database))
        self.resolver = Resolver(
            config.dns.server_addresses, config.dns.timeout, config.dns.min_ttl, config.dns.max_ttl
        )
        audit_path = config.paths.audit_log
        if audit_path != "-":
            audit_file = config.path(audit_path)
            audit_file.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            audit_path = str(audit_file)
        self.metrics = Metrics()
        self.egress = EgressTally()
        self.audit = AuditLog(audit_path, self._observe, self.metrics.audit_write_errors.inc)
        self.allow_cidrs = config.upstream.allowed_networks
        self.own_endpoints = [(ipaddress.ip_address(host), port) for host, port in config.proxy.addresses]
        self.tunnels = Tunnels()
        self.secrets = SecretStore(config, state)
        self._injected: dict[str, set[str]] = {}
        self.metrics.runs_active.set(self.runs.count_active(time.time()))
        self.metrics.track(self.metrics.tunnels_active, lambda: len(self.tunnels))
        self.metrics.track(self.metrics.policies_loaded, lambda: len(self.policies.current))

    def _observe(self, event: str, decision: str, reason: str | None, subject: Subject,
                 extra: dict[str, object]) -> None:
        """Every audited decision is counted twice: in the metrics, and in the run's own egress tally."""
        self.metrics.observe_decision(event, decision, reason, subject, extra)
        self.egress.observe(event, decision, reason, subject)

    def close(self) -> None:
        self.runs.close()
        self.audit.close()

    # --- the gate --------------------------------------------------------------------------------------

    def authenticate(self, header: str | None) -> Run | Decision:
        """Step 1: the run a Proxy-Authorization header value names, or why not."""
        if not header:
            return deny(Reason.AUTH_REQUIRED, "proxy credentials are required (the run's token)")
        token = token_from_header(header)
        run = self.runs.by_token(token) if token else None
        if run is None:
            return deny(Reason.TOKEN_INVALID, "the proxy token is not valid")
        refused = run.refusal(time.time())
        if refused is Reason.TOKEN_REVOKED:
            return deny(refused, f"run {run.run_id} was revoked")
        if refused is Reason.TOKEN_EXPIRED:
            return deny(refused, f"run {run.run_id} expired at {rfc3339(run.expires_at)}")
        return run

    def policy_of(self, run: Run) -> Policy | Decision:
        policy = self.policies.current.get(run.policy, run.version)
        if policy is None or policy.sha256 != run.policy_sha256:
            return deny(Reason.POLICY_GONE, f"policy {run.policy}@{run.version} of this run is no longer loaded")
        return policy

    async def check_target(self, policy: Policy, raw_host: str, port: int) -> TargetCheck:
        """Steps 3-6: the target's name, port and policy, then its addresses, resolved by egressd."""
        target = decide_target(policy, raw_host, port)
        if isinstance(target, Decision):
            return TargetCheck(target)
        try:
            resolution = await self.resolver.resolve(target.host)
        except DnsFailure as err:
            self.metrics.dns_lookups.labels(DNS_FAILURE_RESULTS[err.kind]).inc()
            return TargetCheck(deny(Reason.DNS_FAILURE, str(err)), target)
        decision = decide_addresses(target.host, resolution.addresses, self.allow_cidrs, self.own_endpoints)
        if not decision.allowed:
            self.metrics.dns_lookups.labels("forbidden").inc()
            return TargetCheck(decision, target)
        self.metrics.dns_lookups.labels("cached" if resolution.cached else "ok").inc()
        return TargetCheck(ALLOW, target, str(resolution.addresses[0]))

    # --- control operations ----------------------------------------------------------------------------

    def mint(self, policy_name: str, version: int | None, ttl: float | None, label: str,
             secret_values: dict[str, str] | None = None) -> dict[str, object]:
        policy = self.policies.current.get(policy_name, version)
        if policy is None:
            wanted = policy_name if version is None else f"{policy_name}@{version}"
            raise RequestError(f"no policy {wanted} is loaded")
        ttl = DEFAULT_TTL if ttl is None else ttl
        if not 0 < ttl <= MAX_TTL:
            raise RequestError(f"ttl must be between 1 and {MAX_TTL} seconds")
        if len(label) > 200:
            raise RequestError("label is longer than 200 characters")
        run_values = self._run_values(policy, secret_values or {})
        names = [binding.name for binding in policy.secret]
        run, token, placeholders = self.runs.mint(policy.name, policy.version, policy.sha256, ttl, label, names)
        self.secrets.put_run(run.run_id, run_values)
        self.record_run_event("mint", run)
        host, port = self.config.proxy.addresses[0]
        host = f"[{host}]" if ":" in host else host
        return {
            "run_id": run.run_id,
            "token": token,
            "policy": run.policy,
            "version": run.version,
            "policy_sha256": run.policy_sha256,
            "expires_at": rfc3339(run.expires_at),
            "proxy_url": f"http://egressd:{token}@{host}:{port}",
            "placeholders": placeholders,
        }

    def _run_values(self, policy: Policy, given: dict[str, str]) -> dict[str, str]:
        """The per-run values for a mint, checked against what the policy binds and the daemon has."""
        bound = {binding.name for binding in policy.secret}
        for name in sorted(set(given) - bound):
            raise RequestError(f"policy {policy.label} binds no secret {name}")
        for name in sorted(bound - set(given) - set(self.secrets.operator)):
            raise RequestError(f"policy {policy.label} needs secret {name}: the daemon has no such secret "
                               f"and the mint does not supply it (--secret {name}=@FILE)")
        try:
            return {name: check_value(name, value) for name, value in given.items()}
        except SecretError as err:
            raise RequestError(str(err)) from None
    def revoke(self, run_id: str) -> dict[str, object]:
        before = self.runs.get(run_id)
        if before is None:
            raise RequestError(f"no run {run_id}")
        run = self.runs.revoke(run_id)
        assert run is not None
        if before.refusal(time.time()) is None:  # only a live run's revocation is an event
            self.end_run("revoke", run)
        return run.summary(time.time())

    def run_egress(self, run_id: str) -> dict[str, object]:
        if self.runs.get(run_id) is None:
            raise RequestError(f"no run {run_id}")
        return self.egress.summary(run_id)

    def list_runs(self) -> list[dict[str, object]]:
        now = time.time()
        return [run.summary(now) for run in self.runs.all()]

    def reload(self) -> dict[str, object]:
        problems = self.policies.reload()
        self.metrics.policy_reloads.labels("error" if problems else "ok").inc()
        for problem in problems:
            log.error("policy reload: %s", problem)
        loaded = sorted(policy.label for policy in self.policies.current.versions.values())
        return {"ok": not problems, "problems": problems, "loaded": loaded}

    async def explain(self, policy_name: str, version: int | None, method: str, url: str) -> dict[str, object]:
        """The decision the live gate would give this request, resolving DNS but sending nothing upstream."""
        policy = self.policies.current.get(policy_name, version)
        if policy is None:
            raise RequestError(f"no policy {policy_name}{'' if version is None else f'@{version}'} is loaded")
        decision = await self._explain(policy, method.upper(), url)
        return {"decision": "allow" if decision.allowed else "deny",
                "reason": decision.reason.value if decision.reason else None,
                "detail": decision.detail}

    async def _explain(self, policy: Policy, method: str, url: str) -> Decision:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as err:
            return deny(Reason.INVALID_HOST, f"{url!r} is not a URL: {err}")
        if parts.scheme.lower() != "https":
            return deny(Reason.HTTPS_ONLY, "only HTTPS is proxied")
        raw_host = parts.hostname or ""
        if parts.netloc.rpartition("@")[2].startswith("["):
            raw_host = f"[{raw_host}]"
        checked = await self.check_target(policy, raw_host, port or 443)
        if not checked.decision.allowed or checked.target is None:
            return checked.decision
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        facts = RequestFacts(method=method, path=path, authority=parts.netloc.rpartition("@")[2],
                             host_headers=(), sni=checked.target.host)
        return decide_request(checked.target, facts)

    # --- audit ---------------------------------------------------------------------------------------

    def end_run(self, what: str, run: Run) -> None:
        """A run was revoked or expired: recorded, and its per-run secret values are gone."""
        self.record_run_event(what, run)
        self.secrets.drop_run(run.run_id)
        self._injected.pop(run.run_id, None)
        self.egress.forget(run.run_id)

    def run_secrets(self, run: Run, policy: Policy) -> RunSecrets:
        placeholders = self.runs.placeholders(run.run_id)
        return RunSecrets(
            names={placeholder: name for name, placeholder in placeholders.items()},
            values=self.secrets.values_for(run.run_id, list(placeholders)),
            bindings={binding.name: binding for binding in policy.secret},
        )

    def injected_names(self, run_id: str) -> set[str]:
        """The secrets sent on this run's behalf so far (their values are scrubbed from all its replies)."""
        if run_id not in self._injected:
            self._injected[run_id] = self.runs.injected(run_id)
        return self._injected[run_id]

    def record_injection(self, run: Run, names: set[str]) -> None:
        known = self.injected_names(run.run_id)
        if not names <= known:
            self.runs.mark_injected(run.run_id, names - known)
            known |= names
        for name in names:
            self.metrics.secret_injections.labels(run.policy, name).inc()

    def record_run_event(self, what: str, run: Run) -> None:
        subject = Subject(run_id=run.run_id, policy=run.policy, policy_version=run.version)
        self.audit.record("run", "allow", None, subject, action=what, label=run.label,
                          expires_at=rfc3339(run.expires_at))
