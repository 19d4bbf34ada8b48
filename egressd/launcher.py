"""`egressd run`: a command in a sandbox whose only way out is egressd, for one run, with limits.

Mints a run (with any per-run secrets), starts the command under bubblewrap with the proxy reachable only
through a Unix socket relayed to egressd's listener, enforces a wall-clock timeout, a memory cap and a
process cap, and, whatever happens, revokes the run and leaves no process of the sandbox behind."""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from egressd import forwarder
from egressd.ca import CERT
from egressd.config import Config
from egressd.control import call
from egressd.limits import Confinement, Limits, confine
from egressd.relay import ProxyRelay
from egressd.sandbox import HIDDEN_IN_ETC, HOME, NOBODY, SandboxSpec, bwrap_arguments, forbidden_overlap
from egressd.seccomp import SeccompUnavailable, build_filter, filter_fd

TIMEOUT_STATUS, MEMORY_STATUS = 124, 137
PR_SET_CHILD_SUBREAPER = 36
POLL = 0.05
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class LaunchError(RuntimeError):
    """The sandbox cannot be started; the message says why and what to install or change."""


def parse_size(text: str) -> int:
    """'512M', '2G', '65536K' or a byte count."""
    number, unit = text.strip().upper().removesuffix("IB").removesuffix("B"), ""
    if number and number[-1] in "KMG":
        number, unit = number[:-1], number[-1]
    if not number.isdigit() or int(number) <= 0:
        raise LaunchError(f"{text!r} is not a size (e.g. 512M, 2G)")
    return int(number) * _UNITS[unit]


@dataclass
class RunRequest:
    policy: str
    version: int | None
    command: Sequence[str]
    secrets: dict[str, str] = field(default_factory=dict)
    timeout: float = 300.0
    memory: int = 512 << 20
    pids: int = 256
    ro: Sequence[Path] = ()
    rw: Sequence[Path] = ()
    workdir: str = HOME
    require_seccomp: bool = False


@dataclass
class Outcome:
    run_id: str
    exit_status: int
    limit: str | None
    wall_seconds: float
    mechanisms: dict[str, object]
    egress: dict[str, object] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"run_id": self.run_id, "exit_status": self.exit_status, "limit": self.limit,
                "wall_seconds": self.wall_seconds, "mechanisms": self.mechanisms, "egress": self.egress}

    def describe(self) -> str:
        lines = [f"egressd run {self.run_id}: exit status {self.exit_status}"
                 + (f" ({self.limit} limit)" if self.limit else "") + f", {self.wall_seconds:.1f} s",
                 f"  egress: {self.egress.get('allowed', 0)} allowed, {self.egress.get('refused', 0)} refused"]
        refusals = self.egress.get("refusals") or []
        assert isinstance(refusals, list)
        lines += [f"    {item['count']:>5}  {item['host']}  {item['reason']}" for item in refusals]
        return "\n".join(lines)


def protected_paths(config: Config, config_file: Path | None) -> list[Path]:
    """What no sandbox may see: egressd's state, CA, policies' config, control socket and secret files."""
    paths = [config.path(config.paths.state), config.path(config.paths.ca), config.path(config.control.socket)]
    paths += [config.path(source.file) for source in config.secrets.values() if source.file]
    if config_file is not None:
        paths.append(config_file.resolve())
    return paths


def proxy_address(config: Config) -> tuple[str, int]:
    host, port = config.proxy.addresses[0]
    unspecified = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 (a listen address, mapped to loopback)
    return unspecified.get(host, host), port


def launch(config: Config, config_file: Path | None, request: RunRequest) -> Outcome:
    if shutil.which("bwrap") is None:
        raise LaunchError("bubblewrap is not installed (Debian package: bubblewrap)")
    if not Path("/usr/bin/python3").exists():
        raise LaunchError("the sandbox needs /usr/bin/python3 for its proxy forwarder (Debian package: python3)")
    paths = [Path(path).resolve() for path in (*request.ro, *request.rw)]
    overlap = forbidden_overlap(paths, protected_paths(config, config_file))
    if overlap is not None:
        raise LaunchError(f"{overlap[0]} would expose {overlap[1]} to the sandbox")
    program, seccomp_error = _seccomp(request.require_seccomp)
    control = config.path(config.control.socket)
    minted = call(control, {"op": "mint", "policy": request.policy, "version": request.version,
                            "ttl": request.timeout + 60, "label": "egressd run", "secrets": request.secrets})
    assert isinstance(minted, dict)
    run_id = str(minted["run_id"])
    started = time.monotonic()
    outcome = Outcome(run_id, 1, None, 0.0, {"seccomp": program is not None})
    try:
        if seccomp_error:
            print(f"egressd run: no seccomp filter: {seccomp_error}", file=sys.stderr)
        outcome = _sandboxed(config, request, minted, program, started)
    finally:
        # Whatever happened, the run ends here: its egress is read, then its token no longer opens anything.
        with contextlib.suppress(Exception):
            egress = call(control, {"op": "egress", "run_id": run_id})
            assert isinstance(egress, dict)
            outcome.egress = egress
        call(control, {"op": "revoke", "run_id": run_id})
    return outcome


def _seccomp(required: bool) -> tuple[bytes | None, str]:
    try:
        return build_filter(), ""
    except SeccompUnavailable as err:
        if required:
            raise LaunchError(f"--require-seccomp: {err}") from None
        return None, str(err)


def _sandboxed(config: Config, request: RunRequest, minted: dict, program: bytes | None,
               started: float) -> Outcome:
    run_id = str(minted["run_id"])
    as_root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="egressd-run-") as scratch:
        workspace = Path(scratch)
        workspace.chmod(0o711)  # the sandbox's user may pass through to the socket, not list the directory
        ca = workspace / "ca.pem"
        shutil.copyfile(config.path(config.paths.ca) / CERT, ca)
        forwarder_copy = workspace / "forwarder.py"
        shutil.copyfile(forwarder.__file__, forwarder_copy)
        for path in (ca, forwarder_copy):
            path.chmod(0o644)
        relay = ProxyRelay(workspace / "proxy.sock", proxy_address(config))
        relay.start()
        seccomp_fd = filter_fd(program) if program is not None else None
        try:
            with confine(run_id.removeprefix("run_"), Limits(request.memory, request.pids)) as confinement:
                spec = SandboxSpec(
                    outside_socket=workspace / "proxy.sock", outside_ca=ca, outside_forwarder=forwarder_copy,
                    token=str(minted["token"]), placeholders=dict(minted.get("placeholders") or {}),
                    command=request.command, ro=request.ro, rw=request.rw, workdir=request.workdir,
                    seccomp_fd=seccomp_fd, existing=frozenset(p for p in HIDDEN_IN_ETC if os.path.lexists(p)),
                    directories=frozenset(p for p in HIDDEN_IN_ETC if os.path.isdir(p)),
                )
                drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
                        "--"] if as_root else []
                argv = [*confinement.command_prefix(), *drop, *bwrap_arguments(spec, as_nobody=as_root)]
                status, limit = _supervise(argv, seccomp_fd, request.timeout, confinement)
                mechanisms: dict[str, object] = {**confinement.mechanisms, "seccomp": program is not None}
        finally:
            if seccomp_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(seccomp_fd)
            relay.stop()
    return Outcome(run_id, status, limit, round(time.monotonic() - started, 3), mechanisms)


def _supervise(argv: list[str], seccomp_fd: int | None, timeout: float,
               confinement: Confinement) -> tuple[int, str | None]:
    """Runs the sandbox to its end (or its timeout, or a signal to the launcher); kills whatever is left."""
    _become_subreaper()
    interrupted: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, _frame: interrupted.append(number))
                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    process = subprocess.Popen(argv, pass_fds=(seccomp_fd,) if seccomp_fd is not None else (),
                               start_new_session=True)
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while process.poll() is None:
            if interrupted:
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(POLL)
    finally:
        _kill(process, confinement)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    fired = confinement.fired()
    limit = fired or ("timeout" if timed_out else None)
    if interrupted:
        return 128 + interrupted[0], limit
    if limit == "memory":
        return MEMORY_STATUS, limit
    if timed_out:
        return TIMEOUT_STATUS, limit
    code = process.returncode
    return (128 - code if code < 0 else code), limit


def _kill(process: subprocess.Popen[bytes], confinement: Confinement) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    confinement.kill_all()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)
    _reap_orphans()


def _become_subreaper() -> None:
    """Orphans of the sandbox come to the launcher, which reaps them, instead of lingering as zombies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphans() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def print_outcome(outcome: Outcome, as_json: bool) -> None:
    if as_json:
        sys.stdout.flush()
        print(json.dumps(outcome.as_json()), flush=True)
    else:
        print(outcome.describe(), file=sys.stderr)
