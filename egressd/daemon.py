"""`egressd serve`: egressd's own mitmproxy master, with only the addons the gate needs (not mitmdump's 34),
the control socket, and signal handling (SIGHUP: reload policies and reopen the audit log; SIGUSR1: reopen)."""

import asyncio
import logging
import signal
import ssl
from collections.abc import Callable
from pathlib import Path

import certifi
from mitmproxy import master, options
from mitmproxy.addons import next_layer, proxyserver, tlsconfig

from egressd import addons, engine
from egressd.ca import ensure_ca
from egressd.config import Config, ConfigError
from egressd.control import ControlServer
from egressd.metrics_endpoint import MetricsEndpoint, not_ready
from egressd.secret_store import SecretError
from egressd.service import Service

log = logging.getLogger("egressd")

SYSTEM_TRUST = Path("/etc/ssl/certs/ca-certificates.crt")


class StartupError(RuntimeError):
    pass


def upstream_trust_bundle(config: Config, state_dir: Path) -> Path:
    """System trust plus the operator's extra anchors, as one PEM file for mitmproxy."""
    system = SYSTEM_TRUST if SYSTEM_TRUST.exists() else Path(certifi.where())
    bundle = system.read_bytes()
    if config.upstream.ca_file:
        extra = config.path(config.upstream.ca_file)
        try:
            extra_pem = extra.read_bytes()
            ssl.create_default_context(cadata=extra_pem.decode("ascii"))
        except (OSError, ValueError, ssl.SSLError) as err:
            raise ConfigError(f"upstream.ca_file: {extra}: not a readable PEM certificate file: {err}") from None
        bundle += b"\n" + extra_pem
    path = state_dir / "upstream-trust.pem"
    path.write_bytes(bundle)
    return path


def mitmproxy_options(config: Config, ca_dir: Path, trust: Path) -> dict[str, object]:
    return {
        "mode": [f"regular@{host}:{port}" for host, port in config.proxy.addresses],
        "confdir": str(ca_dir),
        # Connect upstream at the CONNECT, so connect failures are answered on the CONNECT itself.
        "connection_strategy": "eager",
        "ssl_verify_upstream_trusted_ca": str(trust),
        "ssl_insecure": False,
        # Never relay bytes that are not HTTP: everything in a tunnel goes through the request gate.
        "rawtcp": False,
        "http2": True,
        "http3": False,
        "websocket": True,
        "store_streamed_bodies": False,
    }


async def serve(config: Config) -> int:
    ca_dir = ensure_ca(config.path(config.paths.ca))
    service = Service(config)
    try:
        service.secrets.load_operator()
    except SecretError as err:
        raise StartupError(f"operator secrets:\n{err}") from None
    problems = service.policies.reload()
    if problems and not service.policies.current.versions:
        for problem in problems:
            log.error("%s", problem)
        raise StartupError("no policy could be loaded")
    for problem in problems:
        log.error("policy: %s", problem)
    if not service.policies.current.versions:
        log.warning("no policies in %s: every CONNECT will be refused", service.policies.directory)
    trust = upstream_trust_bundle(config, service.state_dir)

    engine.install()
    opts = options.Options()
    proxy = master.Master(opts, with_termlog=False)
    proxy.addons.add(
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        addons.ConnectGate(service),
        addons.UpstreamPin(service),
        addons.RequestGate(service),
        addons.ReplyScrubber(service),  # before the ledger, which counts what the scrubber lets through
        addons.RequestLedger(service),
        addons.RunReaper(service),
    )
    opts.update(**mitmproxy_options(config, ca_dir, trust))

    endpoint = None
    if config.metrics.address is not None:
        host, port = config.metrics.address
        endpoint = MetricsEndpoint(service.metrics, host, port, _readiness(service, proxy, len(config.proxy.addresses)))
        try:
            await endpoint.start()
        except OSError as err:
            raise StartupError(f"metrics.listen {config.metrics.listen}: {err.strerror}") from None
    control = ControlServer(service, config.path(config.control.socket), config.control.permissions)
    await control.start()
    loop = asyncio.get_running_loop()

    def reload() -> None:
        service.audit.reopen()
        result = service.reload()
        log.info("SIGHUP: policies %s: %s", "reloaded" if result["ok"] else "NOT reloaded", result["loaded"])

    loop.add_signal_handler(signal.SIGHUP, reload)
    loop.add_signal_handler(signal.SIGUSR1, service.audit.reopen)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, proxy.shutdown)

    run = asyncio.create_task(proxy.run())
    try:
        await _wait_listening(proxy, run, len(config.proxy.addresses))
        listening = ", ".join(f"{host}:{port}" for host, port in config.proxy.addresses)
        log.info("egressd listening on %s; control socket %s; CA in %s", listening, control.path, ca_dir)
        await run
    finally:
        await control.stop()
        if endpoint is not None:
            await endpoint.stop()
        service.close()
    return 0


def _readiness(service: Service, proxy: master.Master, listeners: int) -> Callable[[], list[str]]:
    tls: tlsconfig.TlsConfig = proxy.addons.get("tlsconfig")
    server: proxyserver.Proxyserver = proxy.addons.get("proxyserver")

    def missing() -> list[str]:
        return not_ready(
            ca_loaded=tls.certstore is not None,
            policies_loaded=len(service.policies.current) > 0,
            listeners_accepting=server.is_running and len(server.listen_addrs()) >= listeners,
        )

    return missing


async def _wait_listening(proxy: master.Master, run: asyncio.Task[None], wanted: int) -> None:
    server: proxyserver.Proxyserver = proxy.addons.get("proxyserver")
    for _ in range(200):
        if run.done():
            break
        if server.is_running:
            if len(server.listen_addrs()) >= wanted:
                return
            break
        await asyncio.sleep(0.05)
    proxy.shutdown()
    await asyncio.wait_for(run, 10)
    raise StartupError("the proxy listeners did not start (address in use, or no permission?)")
