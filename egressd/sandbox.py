"""What a sandbox is, as bubblewrap arguments; no I/O. The launcher (`egressd run`) fills in the paths.

The sandbox sees a read-only system (/usr, /etc minus what could hold secrets), a fresh /tmp, /run/egressd
(the proxy socket, egressd's CA certificate, the forwarder) and only the paths given with --ro / --rw. It has
new user, PID, network, IPC, UTS and cgroup namespaces; its network has nothing but lo."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

INSIDE = Path("/run/egressd")
PROXY_SOCKET = INSIDE / "proxy.sock"
CA_CERT = INSIDE / "ca.pem"
FORWARDER = INSIDE / "forwarder.py"
PYTHON = "/usr/bin/python3"
HOME = "/tmp/home"
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
                "PIP_CERT")
# Under /etc, what may hold credentials or keys: hidden (files: /dev/null; directories: an empty tmpfs).
HIDDEN_IN_ETC = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh", "/etc/ssl/private",
                 "/etc/egressd", "/etc/sudoers", "/etc/sudoers.d", "/etc/security/opasswd", "/etc/credstore",
                 "/etc/credstore.encrypted", "/etc/NetworkManager/system-connections", "/etc/wireguard")
NOBODY = 65534


@dataclass(frozen=True)
class SandboxSpec:
    outside_socket: Path  # the launcher's end of the proxy socket
    outside_ca: Path  # a readable copy of egressd's CA certificate
    outside_forwarder: Path  # a readable copy of egressd/forwarder.py
    token: str
    placeholders: Mapping[str, str]
    command: Sequence[str]
    ro: Sequence[Path] = ()
    rw: Sequence[Path] = ()
    workdir: str = HOME
    seccomp_fd: int | None = None
    hidden: Sequence[str] = field(default=HIDDEN_IN_ETC)
    existing: frozenset[str] = frozenset()  # which of `hidden` exist on this host (only those can be masked)
    directories: frozenset[str] = frozenset()  # which of those are directories


def environment(spec: SandboxSpec) -> dict[str, str]:
    """The whole environment of the sandbox: nothing inherited."""
    proxy = f"http://egressd:{spec.token}@127.0.0.1:3128"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8", "TZ": "UTC", "NO_PROXY": ""}
    env.update(dict.fromkeys(PROXY_VARIABLES, proxy))
    env.update(dict.fromkeys(CA_VARIABLES, str(CA_CERT)))
    env.update(spec.placeholders)
    return env


def bwrap_arguments(spec: SandboxSpec, as_nobody: bool) -> list[str]:
    args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if as_nobody:
        args += ["--uid", str(NOBODY), "--gid", str(NOBODY)]
    args += ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        args += ["--symlink", f"usr/{link}", f"/{link}"]
    args += ["--ro-bind", "/etc", "/etc"]
    for path in spec.hidden:
        if path in spec.existing:
            args += ["--tmpfs", path] if path in spec.directories else ["--ro-bind", "/dev/null", path]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", HOME, "--tmpfs", "/run",
             "--dir", str(INSIDE),
             "--bind", str(spec.outside_socket), str(PROXY_SOCKET),
             "--ro-bind", str(spec.outside_ca), str(CA_CERT),
             "--ro-bind", str(spec.outside_forwarder), str(FORWARDER)]
    for path in spec.ro:
        args += ["--ro-bind", str(path), str(path)]
    for path in spec.rw:
        args += ["--bind", str(path), str(path)]
    args += ["--chdir", spec.workdir, "--clearenv"]
    for name, value in environment(spec).items():
        args += ["--setenv", name, value]
    if spec.seccomp_fd is not None:
        args += ["--seccomp", str(spec.seccomp_fd)]
    return [*args, "--", PYTHON, "-I", "-S", str(FORWARDER), str(PROXY_SOCKET), "--", *spec.command]


def forbidden_overlap(paths: Sequence[Path], protected: Sequence[Path]) -> tuple[Path, Path] | None:
    """A --ro/--rw path that is, contains or lies inside one egressd keeps from sandboxes (state, CA, config,
    control socket): (the path, what it exposes)."""
    for path in paths:
        for secret in protected:
            if path == secret or path in secret.parents or secret in path.parents:
                return path, secret
    return None
